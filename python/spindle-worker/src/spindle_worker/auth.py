"""The authenticated user Spindle passes in a run's config, as graphs expect to read it."""

from __future__ import annotations

from typing import Any

AUTH_USER_KEY = "langgraph_auth_user"


class AuthUser(dict):  # type: ignore[type-arg]
    """`configurable["langgraph_auth_user"]`: readable by key and by attribute.

    Graphs written for LangGraph Platform read it either way (`user["identity"]`,
    `user.identity`); Spindle sends a plain map. A dict subclass, so it still encodes to
    JSON as the map it came as.
    """

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def identity(self) -> str:
        return str(self.get("identity", ""))

    @property
    def display_name(self) -> str:
        return str(self.get("display_name") or self.identity)

    @property
    def is_authenticated(self) -> bool:
        return bool(self.get("is_authenticated", True))

    @property
    def permissions(self) -> list[str]:
        return list(self.get("permissions") or [])


def wrap_auth_user(configurable: dict[str, Any]) -> None:
    """Make a map under `langgraph_auth_user` an AuthUser, in place."""
    user = configurable.get(AUTH_USER_KEY)
    if isinstance(user, dict) and not isinstance(user, AuthUser):
        configurable[AUTH_USER_KEY] = AuthUser(user)
