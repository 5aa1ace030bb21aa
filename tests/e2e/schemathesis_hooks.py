"""Schemathesis hooks for test_openapi.py, loaded through ``SCHEMATHESIS_HOOKS``."""

from __future__ import annotations

import re

import schemathesis

# A run may wait up to a year before it starts (`after_seconds`, as the document says), and a
# stream or a wait for such a run lasts as long: far past the test's budget (a wait would time
# out). Valid delays are shortened to at most this; invalid ones are left as generated, so
# negative cases stay negative.
MAX_AFTER_SECONDS = 0.5
YEAR_SECONDS = 365 * 86_400


# A run's webhook must be a URL whose host resolves to public addresses, which no schema can
# say (and this machine resolves no public name): a webhook the document allows is left out, so
# that the rest of the body is what the server is tested on. Others stay, so negative cases
# stay negative.
WEBHOOK = re.compile(r"^https?://[^\s/?#]+", re.IGNORECASE)


@schemathesis.hook
def map_case(context, case):
    body = case.body
    for run in body if isinstance(body, list) else [body]:
        if isinstance(run, dict):
            webhook = run.get("webhook")
            if isinstance(webhook, str) and WEBHOOK.match(webhook) and webhook.strip() == webhook:
                del run["webhook"]
            delay = run.get("after_seconds")
            valid = isinstance(delay, (int, float)) and not isinstance(delay, bool)
            if valid and MAX_AFTER_SECONDS < delay <= YEAR_SECONDS:
                run["after_seconds"] = MAX_AFTER_SECONDS
    return case
