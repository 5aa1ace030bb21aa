"""Graph files as a newcomer meets them: docs/graph-files.md, the JSON Schema editors use
(served at /graph-file.schema.json), and `spindle check`.

The documentation is tested as written: every YAML example in it must fit the schema, every
whole graph in it must pass `spindle check`, and the first graph, with the langgraph.json the
page gives, must run through the official client with the result the page prints.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import httpx
import jsonschema
import pytest
import yaml
from langgraph_sdk import get_sync_client

import harness

DOCS = harness.REPO / "docs" / "graph-files.md"
PROVIDERS = harness.REPO / "docs" / "model-providers.md"
EXAMPLES = sorted((harness.REPO / "examples" / "graphs").glob("*.yaml"))
SCHEMA_FILE = harness.REPO / "crates" / "graph" / "graph-file.schema.json"
SCHEMA_LINE = "# yaml-language-server: $schema=http://127.0.0.1:2024/graph-file.schema.json"


def doc_blocks(language: str, page: Path = DOCS) -> list[str]:
    """The fenced code blocks of a page in `language`, in page order."""
    return re.findall(rf"```{language}\n(.*?)```", page.read_text(), flags=re.S)


def yaml_examples() -> list[dict]:
    """Every YAML example of the page, parsed (each is a mapping: a graph or a part of one)."""
    return [yaml.safe_load(block) for block in doc_blocks("yaml") if block.strip() != SCHEMA_LINE]


def is_whole_graph(doc: dict) -> bool:
    return ("nodes" in doc and "edges" in doc) or "variants" in doc


@pytest.fixture(scope="module")
def schema() -> dict:
    return json.loads(SCHEMA_FILE.read_text())


def partial(schema: dict) -> dict:
    """The schema of a part of a graph document: the same keys, none required (the page shows
    a node or a `state` section on its own)."""
    part = copy.deepcopy(schema)
    part["definitions"]["graph"].pop("required")
    return part


def test_the_server_serves_the_schema_editors_read(server, schema):
    """`# yaml-language-server: $schema=<server>/graph-file.schema.json` works: the server
    answers the repository's schema, as JSON Schema, and it is a valid draft-07 schema."""
    r = httpx.get(server.base_url + "/graph-file.schema.json")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/schema+json")
    assert r.json() == schema
    jsonschema.Draft7Validator.check_schema(r.json())


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_graph_fits_the_schema(path, schema):
    jsonschema.validate(yaml.safe_load(path.read_text()), schema)


def test_every_yaml_example_of_the_docs_fits_the_schema(schema):
    examples = yaml_examples()
    assert len(examples) >= 15, "the page lost its examples"
    validator = jsonschema.Draft7Validator(partial(schema))
    for doc in examples:
        errors = [f"{e.message} at {'/'.join(map(str, e.path))}" for e in validator.iter_errors(doc)]
        assert not errors, f"an example of docs/graph-files.md does not fit the schema:\n{yaml.safe_dump(doc)}\n{errors}"


def test_every_model_declaration_of_the_providers_page_fits_the_schema(schema):
    declarations = [yaml.safe_load(block) for block in doc_blocks("yaml", PROVIDERS)]
    declarations = [doc for doc in declarations if isinstance(doc, dict) and "models" in doc]
    assert len(declarations) >= 3, "docs/model-providers.md lost its examples"
    validator = jsonschema.Draft7Validator(partial(schema))
    for doc in declarations:
        errors = [f"{e.message} at {'/'.join(map(str, e.path))}" for e in validator.iter_errors(doc)]
        assert not errors, f"an example of docs/model-providers.md does not fit the schema:\n{yaml.safe_dump(doc)}\n{errors}"


def test_the_schema_refuses_what_the_compiler_refuses(schema, tmp_path):
    """A misspelled key, an unknown node kind and a missing `nodes` are refused by both the
    schema (in the editor) and `spindle check` (naming the file and line)."""
    good = {"nodes": {"a": {"kind": "script", "code": "#{}"}}, "edges": [{"from": "__start__", "to": "a"}]}
    bad = {
        "misspelled key": {**good, "nodes": {"a": {"kind": "script", "cod": "#{}"}}},
        "unknown kind": {**good, "nodes": {"a": {"kind": "scrip", "code": "#{}"}}},
        "no nodes": {"edges": good["edges"]},
        "unknown reducer": {**good, "state": {"n": {"reducer": "sum"}}},
    }
    jsonschema.validate(good, schema)
    for what, doc in bad.items():
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(doc, schema)
        path = tmp_path / f"{what.replace(' ', '_')}.yaml"
        path.write_text(yaml.safe_dump(doc))
        done = harness.run(["check", str(path)], tmp_path)
        assert done.returncode != 0, f"spindle check accepted {what}: {done.stdout}"
        assert f"error: {path}" in done.stderr, done.stderr


def test_every_whole_graph_of_the_docs_passes_spindle_check(tmp_path):
    graphs = [doc for doc in yaml_examples() if is_whole_graph(doc)]
    assert len(graphs) >= 4, "the page lost its whole graphs"
    paths = []
    for i, doc in enumerate(graphs):
        path = tmp_path / f"doc_graph_{i}.yaml"
        path.write_text(yaml.safe_dump(doc))
        paths.append(path)
    done = harness.run(["check", *map(str, paths)], tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("ok: ") == len(paths), done.stdout


def test_spindle_check_names_the_line_of_a_mistake(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text(
        "nodes:\n"
        "  step: {kind: script, code: '#{}'}\n"
        "edges:\n"
        "  - {from: __start__, to: stpe}\n")
    done = harness.run(["check", str(path)], tmp_path)
    assert done.returncode == 1
    assert f"error: {path}:4: at `edges[0].to`: unknown node `stpe`" in done.stderr, done.stderr
    assert "did you mean `step`?" in done.stderr, done.stderr


def test_the_first_graph_of_the_docs_runs_as_the_docs_say(tmp_path):
    """A newcomer copies the page's first graph and its langgraph.json, runs `spindle check`,
    starts `spindle dev` and runs the graph with the official client: the result is the one
    the page prints."""
    first_graph = doc_blocks("yaml")[0]
    assert first_graph.startswith(SCHEMA_LINE), "the first graph should show the editor line"
    config = json.loads(doc_blocks("json")[0])
    assert config == {"graphs": {"counter": "./graphs/counter.yaml"}}
    (tmp_path / "graphs").mkdir()
    (tmp_path / "graphs" / "counter.yaml").write_text(first_graph)
    (tmp_path / "langgraph.json").write_text(json.dumps(config))

    done = harness.run(["check", "langgraph.json"], tmp_path)
    assert done.returncode == 0, done.stderr

    printed = re.search(r"print\(result\)  # (\{.*\})", DOCS.read_text()).group(1)
    expected = eval(printed, {})  # the page prints a Python dict literal
    srv = harness.start(
        "sqlite",
        lambda port: ["dev", "--port", str(port), "--data-dir", str(tmp_path / "data")],
        tmp_path,
    )
    try:
        client = get_sync_client(url=srv.base_url)
        thread = client.threads.create()
        assert client.runs.wait(thread["thread_id"], "counter", input={}) == expected
    finally:
        harness.stop(srv)


def doc_graph_with(marker: str) -> str:
    """The page's one YAML example whose text holds `marker`."""
    found = [block for block in doc_blocks("yaml") if marker in block]
    assert len(found) == 1, f"{len(found)} examples of docs/graph-files.md hold {marker!r}"
    return found[0]


@pytest.fixture(scope="module")
def docs_examples_server(tmp_path_factory):
    """`spindle dev` serving the page's examples of `then`, a graph as a tool, variants,
    `is_last_step` and `destinations`, as a reader would copy them."""
    root = tmp_path_factory.mktemp("docs-examples")
    examples = {
        "refund": doc_graph_with("emit(#{ drafted"),
        "supervisor": doc_graph_with("kind: graph"),
        "writer": doc_graph_with("variants:"),
        "countdown": doc_graph_with("is_last_step"),
        "triage": doc_graph_with("destinations:"),
    }
    for name, text in examples.items():
        (root / f"{name}.yaml").write_text(text)
    config = {"graphs": {name: f"./{name}.yaml" for name in examples}}
    (root / "langgraph.json").write_text(json.dumps(config))
    srv = harness.start(
        "sqlite",
        lambda port: ["dev", "--port", str(port), "--data-dir", str(root / "data")],
        root,
    )
    yield get_sync_client(url=srv.base_url)
    harness.stop(srv)


def texts(values: dict) -> list[str]:
    return [m["content"] for m in values["messages"]]


def test_the_docs_then_example_interrupts_and_goes_where_the_answer_says(docs_examples_server):
    client = docs_examples_server
    thread = client.threads.create()
    chunks = list(client.runs.stream(thread["thread_id"], "refund", input={"messages": [
        {"type": "human", "content": "I want my money back"}]}, stream_mode=["custom", "values"]))
    custom = [c.data for c in chunks if c.event == "custom"]
    assert custom == [{"drafted": "Refund of 120 EUR approved?"}]
    interrupted = [c.data for c in chunks if c.event == "values"][-1]
    assert interrupted["__interrupt__"][0]["value"] == {"question": "Refund of 120 EUR approved?"}
    done = client.runs.wait(thread["thread_id"], "refund", command={"resume": "no"})
    assert done["approved"] == "no"
    assert done["answer"] == "Sorry, no refund."


def test_the_docs_supervisor_hands_work_to_its_research_graph(docs_examples_server):
    client = docs_examples_server
    thread = client.threads.create()
    done = client.runs.wait(thread["thread_id"], "supervisor", input={"messages": [
        {"type": "human", "content": "How many people live in Paris?"}]})
    assert texts(done) == [
        "How many people live in Paris?",
        "",
        "Paris has 2.1 million inhabitants.",
        "Paris has about 2.1 million inhabitants.",
    ]
    assert done["messages"][2]["type"] == "tool"


def test_the_docs_writer_runs_the_variant_each_run_or_assistant_chooses(docs_examples_server):
    client = docs_examples_server
    ask = {"messages": [{"type": "human", "content": "write"}]}
    quick = client.runs.wait(None, "writer", input=ask)
    assert texts(quick)[-1] == "A quick draft."
    thorough = client.runs.wait(None, "writer", input=ask, context={"mode": "thorough"})
    assert texts(thorough)[-2:] == ["A first draft.", "A reviewed draft."]
    careful = client.assistants.create("writer", context={"mode": "thorough"})
    assert texts(client.runs.wait(None, careful["assistant_id"], input=ask))[-1] == "A reviewed draft."
    drawn = client.assistants.get_graph(careful["assistant_id"])
    assert {n["id"] for n in drawn["nodes"]} == {"__start__", "draft", "review", "__end__"}
    thread = client.threads.create()
    run = client.runs.create(thread["thread_id"], "writer", input=ask, context={"mode": "slow"})
    client.runs.join(run["thread_id"], run["run_id"])
    failed = client.runs.get(run["thread_id"], run["run_id"])
    assert failed["status"] == "error"


def test_the_docs_loop_stops_on_its_last_step(docs_examples_server):
    client = docs_examples_server
    done = client.runs.wait(None, "countdown", input={"messages": []}, config={"recursion_limit": 4})
    assert texts(done) == ["step 4", "step 3", "step 2", "step 1"]


def test_the_docs_destinations_are_drawn_and_the_goto_goes_there(docs_examples_server):
    """A goto chosen by `then` shows in the assistant's drawing once declared as
    `destinations`: conditional edges, as LangGraph draws `add_node(..., destinations=...)`."""
    client = docs_examples_server
    done = client.runs.wait(None, "triage", input={"messages": [{"type": "human", "content": "refund?"}]})
    assert done["answer"] == "Sorry, no refund."
    drawn = client.assistants.get_graph("triage")
    assert drawn["edges"] == [
        {"source": "__start__", "target": "decide"},
        {"source": "decide", "target": "__end__", "conditional": True},
        {"source": "decide", "target": "apologise", "conditional": True},
        {"source": "apologise", "target": "__end__"},
    ]
