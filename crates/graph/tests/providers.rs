//! Model providers and tools against a fake OpenAI-compatible server running in the test.

mod common;

use std::sync::{Arc, Mutex};

use common::{texts, Harness};
use serde_json::{json, Value};
use spindle_graph::spec::{load_str, Format};
use spindle_graph::{RunInput, StreamMode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A recorded request: first line, headers (lower-cased), body.
#[derive(Debug, Clone)]
struct Seen {
    line: String,
    headers: Vec<(String, String)>,
    body: Value,
}

/// Serves one canned response per request, in order; records what it got.
async fn fake_server(responses: Vec<(u16, String, String)>) -> (String, Arc<Mutex<Vec<Seen>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        for (status, content_type, reply_body) in responses {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let mut buf = Vec::new();
            let mut tmp = [0u8; 4096];
            let (head_end, content_length) = loop {
                let n = sock.read(&mut tmp).await.unwrap_or(0);
                if n == 0 {
                    return;
                }
                buf.extend_from_slice(&tmp[..n]);
                if let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&buf[..pos]).to_string();
                    let len = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                        })
                        .unwrap_or(0);
                    break (pos + 4, len);
                }
            };
            while buf.len() < head_end + content_length {
                let n = sock.read(&mut tmp).await.unwrap_or(0);
                if n == 0 {
                    break;
                }
                buf.extend_from_slice(&tmp[..n]);
            }
            let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
            let mut lines = head.lines();
            let line = lines.next().unwrap_or_default().to_string();
            let headers = lines
                .filter_map(|l| {
                    l.split_once(':')
                        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
                })
                .collect();
            let body = serde_json::from_slice(&buf[head_end..]).unwrap_or(Value::Null);
            log.lock().unwrap().push(Seen {
                line,
                headers,
                body,
            });
            if content_type == "text/event-stream" {
                send_events(&mut sock, status, &reply_body).await;
            } else {
                let reply = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{reply_body}",
                    reply_body.len()
                );
                let _ = sock.write_all(reply.as_bytes()).await;
            }
            let _ = sock.shutdown().await;
        }
    });
    (format!("http://{addr}"), seen)
}

/// Streams an SSE body as the APIs do: chunked, one event per write, with pauses, so the
/// client sees the events arrive one by one.
async fn send_events(sock: &mut tokio::net::TcpStream, status: u16, body: &str) {
    let head = format!("HTTP/1.1 {status} X\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n");
    let _ = sock.write_all(head.as_bytes()).await;
    for event in body.split_inclusive("\n\n") {
        let chunk = format!("{:x}\r\n{event}\r\n", event.len());
        let _ = sock.write_all(chunk.as_bytes()).await;
        let _ = sock.flush().await;
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let _ = sock.write_all(b"0\r\n\r\n").await;
}

fn sse(chunks: &[Value]) -> String {
    let mut s = String::new();
    for c in chunks {
        s.push_str(&format!("data: {c}\n\n"));
    }
    s.push_str("data: [DONE]\n\n");
    s
}

fn delta(d: Value) -> Value {
    json!({"choices": [{"index": 0, "delta": d, "finish_reason": null}]})
}

fn agent_yaml(base: &str) -> String {
    agent_with(&format!(
        r#"{{provider: openai, base_url: "{base}/v1", model: test-model, api_key_env: SPINDLE_TEST_KEY}}"#
    ))
}

/// The add-tool agent whose model `llm` is declared by `model` (a YAML flow mapping).
fn agent_with(model: &str) -> String {
    format!(
        r#"
state: {{messages: messages}}
models:
  llm: {model}
tools:
  add:
    kind: script
    description: Add two numbers.
    parameters: {{type: object, properties: {{a: {{type: integer}}, b: {{type: integer}}}}}}
    code: "args.a + args.b"
nodes:
  model: {{kind: model, model: llm, tools: [add], system: "Be brief."}}
  tools: {{kind: tools, tools: [add]}}
edges:
  - {{from: __start__, to: model}}
  - {{from: model, route: tools_condition, to: [tools, __end__]}}
  - {{from: tools, to: model}}
"#
    )
}

#[tokio::test]
async fn openai_provider_streams_tokens_and_calls_tools() {
    std::env::set_var("SPINDLE_TEST_KEY", "sk-test");
    let first = sse(&[
        delta(
            json!({"role": "assistant", "tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "add", "arguments": ""}}]}),
        ),
        delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"a\": 2,"}}]})),
        delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": " \"b\": 3}"}}]})),
    ]);
    let second = sse(&[
        delta(json!({"content": "The sum"})),
        delta(json!({"content": " is 5."})),
    ]);
    let (base, seen) = fake_server(vec![
        (200, "text/event-stream".into(), first),
        (200, "text/event-stream".into(), second),
    ])
    .await;
    let g = Arc::new(load_str(&agent_yaml(&base), "agent.yaml", "agent", Format::Yaml).unwrap());
    let (out, events) = Harness::new()
        .run(
            &g,
            Some("t"),
            RunInput::Values(json!({"messages": [{"role": "user", "content": "2+3?"}]})),
            &[StreamMode::Messages],
            |_| {},
        )
        .await;
    let v = out.unwrap().values;
    assert_eq!(texts(&v), ["2+3?", "", "5", "The sum is 5."]);
    assert_eq!(
        v["messages"][1]["tool_calls"],
        json!([{"name": "add", "args": {"a": 2, "b": 3}, "id": "call_1", "type": "tool_call"}])
    );
    // Tokens arrive as AIMessageChunk with LangGraph's metadata.
    let chunks: Vec<&Value> = events
        .iter()
        .map(|e| &e.data)
        .filter(|d| d[0]["type"] == "AIMessageChunk")
        .collect();
    let text: String = chunks
        .iter()
        .map(|c| c[0]["content"].as_str().unwrap())
        .collect();
    assert_eq!(text, "The sum is 5.");
    assert_eq!(chunks[0][1]["langgraph_node"], "model");
    let pieces: Vec<Value> = chunks
        .iter()
        .map(|c| c[0]["tool_call_chunks"].clone())
        .filter(|t| t.as_array().is_some_and(|a| !a.is_empty()))
        .map(|t| t[0]["args"].clone())
        .collect();
    assert_eq!(pieces, ["", "{\"a\": 2,", " \"b\": 3}"]);
    assert_eq!(
        v["messages"][3]["response_metadata"]["model_name"],
        "test-model"
    );
    // The tool message (not streamed by a model) is streamed whole.
    assert!(events
        .iter()
        .any(|e| e.data[0]["type"] == "tool" && e.data[0]["content"] == "5"));
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    assert!(seen[0].line.starts_with("POST /v1/chat/completions"));
    assert!(seen[0]
        .headers
        .contains(&("authorization".into(), "Bearer sk-test".into())));
    let body = &seen[0].body;
    assert_eq!(body["model"], "test-model");
    assert_eq!(body["stream"], true);
    assert_eq!(
        body["messages"][0],
        json!({"role": "system", "content": "Be brief."})
    );
    assert_eq!(
        body["messages"][1],
        json!({"role": "user", "content": "2+3?"})
    );
    assert_eq!(body["tools"][0]["function"]["name"], "add");
    let second = &seen[1].body["messages"];
    assert_eq!(
        second[2]["tool_calls"][0]["function"]["arguments"],
        "{\"a\":2,\"b\":3}"
    );
    assert_eq!(
        second[3],
        json!({"role": "tool", "content": "5", "tool_call_id": "call_1"})
    );
}

#[tokio::test]
async fn openai_errors_fail_the_node_with_api_error() {
    let (base, _) = fake_server(vec![(
        500,
        "application/json".into(),
        "{\"error\": \"down\"}".into(),
    )])
    .await;
    let g = Arc::new(load_str(&agent_yaml(&base), "agent.yaml", "agent", Format::Yaml).unwrap());
    let (out, _) = Harness::new()
        .run(
            &g,
            None,
            RunInput::Values(json!({"messages": ["hi"]})),
            &[],
            |_| {},
        )
        .await;
    let e = out.unwrap_err();
    assert_eq!(e.class(), "APIError");
    assert!(e.message().contains("500"), "{}", e.message());
}

/// A graph whose scripted model makes the tool `calls` (a YAML list) to the HTTP tool `tool`
/// (a GET of `url`), then answers "done".
fn http_tool_agent(tool: &str, url: &str, calls: &str) -> String {
    format!(
        r#"
state: {{messages: messages}}
models:
  m:
    provider: scripted
    responses:
      - content: ""
        tool_calls: {calls}
      - "done"
tools:
  {tool}: {{kind: http, method: GET, url: "{url}", parameters: {{type: object}}}}
nodes:
  model: {{kind: model, model: m, tools: [{tool}]}}
  tools: {{kind: tools, tools: [{tool}]}}
edges:
  - {{from: __start__, to: model}}
  - {{from: model, route: tools_condition, to: [tools, __end__]}}
  - {{from: tools, to: model}}
"#
    )
}

#[tokio::test]
async fn http_tools_fill_the_url_and_failures_become_error_messages() {
    let (base, seen) = fake_server(vec![
        (200, "text/plain".into(), "sunny".into()),
        (500, "text/plain".into(), "boom".into()),
    ])
    .await;
    let calls = r#"[{name: weather, args: {city: "New York", units: metric}, id: c1},
                    {name: weather, args: {city: Paris}, id: c2}]"#;
    let yaml = http_tool_agent("weather", &format!("{base}/w/{{city}}"), calls);
    let g = Arc::new(load_str(&yaml, "w.yaml", "w", Format::Yaml).unwrap());
    let (out, _) = Harness::new()
        .run(
            &g,
            None,
            RunInput::Values(json!({"messages": ["weather?"]})),
            &[],
            |_| {},
        )
        .await;
    let v = out.unwrap().values;
    let msgs = v["messages"].as_array().unwrap();
    let tool_msgs: Vec<&Value> = msgs.iter().filter(|m| m["type"] == "tool").collect();
    assert_eq!(tool_msgs.len(), 2);
    let ok = tool_msgs
        .iter()
        .find(|m| m["content"] == "sunny")
        .expect("one call succeeded");
    assert_eq!(ok["status"], "success");
    let failed = tool_msgs
        .iter()
        .find(|m| m["status"] == "error")
        .expect("the failing call became an error message");
    assert!(failed["content"].as_str().unwrap().contains("HTTP 500"));
    assert_eq!(msgs.last().unwrap()["content"], "done");
    let lines: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|s| s.line.clone())
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("GET /w/New%20York?units=metric ")),
        "{lines:?}"
    );
}

/// Serves one chunked response whose body comes in `parts`, 50 ms apart.
async fn chunked_server(parts: Vec<Vec<u8>>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let Ok((mut sock, _)) = listener.accept().await else {
            return;
        };
        let mut head = Vec::new();
        let mut tmp = [0u8; 4096];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = sock.read(&mut tmp).await.unwrap_or(0);
            if n == 0 {
                return;
            }
            head.extend_from_slice(&tmp[..n]);
        }
        let start =
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n";
        sock.write_all(start.as_bytes()).await.unwrap();
        for part in parts {
            sock.write_all(format!("{:x}\r\n", part.len()).as_bytes())
                .await
                .unwrap();
            sock.write_all(&part).await.unwrap();
            sock.write_all(b"\r\n").await.unwrap();
            sock.flush().await.unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        sock.write_all(b"0\r\n\r\n").await.unwrap();
    });
    format!("http://{addr}")
}

#[tokio::test]
async fn an_http_tool_streams_its_output_as_it_arrives() {
    // "é" is split between two parts: no delta carries half a character.
    let e_acute = "é".as_bytes();
    let parts = vec![
        b"step 1 done\n".to_vec(),
        [b"caf".as_slice(), &e_acute[..1]].concat(),
        [&e_acute[1..], b" ready\n".as_slice()].concat(),
    ];
    let base = chunked_server(parts).await;
    let yaml = http_tool_agent(
        "job",
        &format!("{base}/job"),
        "[{name: job, args: {}, id: c1}]",
    );
    let g = Arc::new(load_str(&yaml, "j.yaml", "j", Format::Yaml).unwrap());
    let (out, events) = Harness::new()
        .run(
            &g,
            None,
            RunInput::Values(json!({"messages": ["run the job"]})),
            &[StreamMode::Tools],
            |_| {},
        )
        .await;
    let whole = "step 1 done\ncafé ready\n";
    let tool_msg = out.unwrap().values["messages"][2].clone();
    assert_eq!(tool_msg["content"], whole);
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| e.data["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "tool-started",
            "tool-output-delta",
            "tool-output-delta",
            "tool-output-delta",
            "tool-finished"
        ]
    );
    let deltas: Vec<&str> = events
        .iter()
        .filter_map(|e| e.data.get("delta").and_then(Value::as_str))
        .collect();
    assert_eq!(deltas, ["step 1 done\n", "caf", "é ready\n"]);
    assert!(events.iter().all(|e| e.data["tool_call_id"] == "c1"));
}

#[tokio::test]
async fn scripted_model_streams_by_word_or_char_and_picks_by_ai_count() {
    for (chunk, expected) in [
        ("word", vec!["Hello", " ", "big", " ", "world"]),
        ("char", vec!["H", "i", "!"]),
    ] {
        let text = if chunk == "word" {
            "Hello big world"
        } else {
            "Hi!"
        };
        let yaml = format!(
            "state: {{messages: messages}}\nmodels:\n  m: {{provider: scripted, chunk: {chunk}, responses: [\"{text}\", \"second\"]}}\nnodes:\n  model: {{kind: model, model: m}}\nedges:\n  - {{from: __start__, to: model}}\n"
        );
        let g = Arc::new(load_str(&yaml, "s.yaml", "s", Format::Yaml).unwrap());
        let h = Harness::new();
        let (out, events) = h
            .run(
                &g,
                Some("t"),
                RunInput::Values(json!({"messages": ["hi"]})),
                &[StreamMode::Messages],
                |_| {},
            )
            .await;
        out.unwrap();
        let pieces: Vec<&str> = events
            .iter()
            .map(|e| e.data[0]["content"].as_str().unwrap())
            .collect();
        assert_eq!(pieces, expected);
        let ids: std::collections::HashSet<&str> = events
            .iter()
            .map(|e| e.data[0]["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids.len(), 1, "chunks of one reply share an id");
        // One AI message present: the next turn gets the second reply.
        let (out, _) = h
            .run(
                &g,
                Some("t"),
                RunInput::Values(json!({"messages": ["again"]})),
                &[],
                |_| {},
            )
            .await;
        assert_eq!(texts(&out.unwrap().values).last().unwrap(), "second");
    }
}

/// Runs the add-tool agent on "2+3?", streaming `messages`; gives the final values and the
/// AIMessageChunks streamed.
async fn run_agent(yaml: &str) -> (Result<Value, String>, Vec<Value>) {
    let g = Arc::new(load_str(yaml, "agent.yaml", "agent", Format::Yaml).unwrap());
    let (out, events) = Harness::new()
        .run(
            &g,
            Some("t"),
            RunInput::Values(json!({"messages": [{"role": "user", "content": "2+3?"}]})),
            &[StreamMode::Messages],
            |_| {},
        )
        .await;
    let chunks = events
        .into_iter()
        .map(|e| e.data[0].clone())
        .filter(|d| d["type"] == "AIMessageChunk")
        .collect();
    (
        out.map(|o| o.values).map_err(|e| e.message().to_string()),
        chunks,
    )
}

/// The streamed text and tool call argument pieces, in order.
fn streamed(chunks: &[Value]) -> (String, Vec<String>) {
    let text = chunks
        .iter()
        .map(|c| c["content"].as_str().unwrap())
        .collect();
    let args = chunks
        .iter()
        .flat_map(|c| c["tool_call_chunks"].as_array().unwrap().clone())
        .map(|t| t["args"].as_str().unwrap().to_string())
        .filter(|a| !a.is_empty())
        .collect();
    (text, args)
}

fn header<'a>(seen: &'a Seen, name: &str) -> Option<&'a str> {
    seen.headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// An Anthropic Messages stream: `event:` names and JSON data, as the API sends them.
fn anthropic_sse(events: &[(&str, Value)]) -> String {
    events
        .iter()
        .map(|(name, data)| format!("event: {name}\ndata: {data}\n\n"))
        .collect()
}

fn anthropic_start(input_tokens: u64) -> (&'static str, Value) {
    (
        "message_start",
        json!({"type": "message_start", "message": {"id": "msg_01", "type": "message", "role": "assistant", "model": "claude-test-20250101", "content": [], "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": input_tokens, "output_tokens": 1}}}),
    )
}

fn anthropic_end(stop_reason: &str, output_tokens: u64) -> [(&'static str, Value); 2] {
    [
        (
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": null}, "usage": {"output_tokens": output_tokens}}),
        ),
        ("message_stop", json!({"type": "message_stop"})),
    ]
}

fn anthropic_model(base: &str) -> String {
    format!(
        r#"{{provider: anthropic, base_url: "{base}", model: claude-test, api_key_env: SPINDLE_TEST_ANTHROPIC_KEY, params: {{max_tokens: 256, temperature: 0}}}}"#
    )
}

#[tokio::test]
async fn anthropic_provider_streams_text_and_tool_use() {
    std::env::set_var("SPINDLE_TEST_ANTHROPIC_KEY", "sk-ant-test");
    let mut tool_turn = vec![
        anthropic_start(20),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Adding."}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "toolu_01", "name": "add", "input": {}}}),
        ),
        ("ping", json!({"type": "ping"})),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"a\": 2"}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": ", \"b\": 3}"}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 1}),
        ),
    ];
    tool_turn.extend(anthropic_end("tool_use", 30));
    let mut text_turn = vec![
        {
            let mut start = anthropic_start(50);
            start.1["message"]["usage"]["cache_read_input_tokens"] = json!(10);
            start
        },
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "The sum"}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": " is"}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": " 5."}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
    ];
    text_turn.extend(anthropic_end("end_turn", 7));
    let (base, seen) = fake_server(vec![
        (200, "text/event-stream".into(), anthropic_sse(&tool_turn)),
        (200, "text/event-stream".into(), anthropic_sse(&text_turn)),
    ])
    .await;
    let (out, chunks) = run_agent(&agent_with(&anthropic_model(&base))).await;
    let v = out.unwrap();
    assert_eq!(texts(&v), ["2+3?", "Adding.", "5", "The sum is 5."]);
    let call = &v["messages"][1];
    assert_eq!(
        call["tool_calls"],
        json!([{"name": "add", "args": {"a": 2, "b": 3}, "id": "toolu_01", "type": "tool_call"}])
    );
    assert_eq!(call["response_metadata"]["stop_reason"], "tool_use");
    let answer = &v["messages"][3];
    assert_eq!(
        answer["response_metadata"]["model_name"],
        "claude-test-20250101"
    );
    assert_eq!(answer["response_metadata"]["stop_reason"], "end_turn");
    assert_eq!(
        answer["usage_metadata"],
        json!({"input_tokens": 60, "output_tokens": 7, "total_tokens": 67})
    );
    let (text, args) = streamed(&chunks);
    assert_eq!(text, "Adding.The sum is 5.");
    assert_eq!(args, ["{\"a\": 2", ", \"b\": 3}"]);
    assert!(chunks.len() >= 6, "{chunks:?}");
    let last = chunks.last().unwrap();
    assert_eq!(last["chunk_position"], "last");
    assert_eq!(last["response_metadata"]["stop_reason"], "end_turn");

    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    assert!(
        seen[0].line.starts_with("POST /v1/messages "),
        "{}",
        seen[0].line
    );
    assert_eq!(header(&seen[0], "x-api-key"), Some("sk-ant-test"));
    assert_eq!(header(&seen[0], "anthropic-version"), Some("2023-06-01"));
    assert_eq!(header(&seen[0], "authorization"), None);
    let body = &seen[0].body;
    assert_eq!(body["model"], "claude-test");
    assert_eq!(body["stream"], true);
    assert_eq!(body["max_tokens"], 256, "params override the default");
    assert_eq!(body["temperature"], 0);
    assert_eq!(body["system"], "Be brief.");
    assert_eq!(
        body["messages"],
        json!([{"role": "user", "content": [{"type": "text", "text": "2+3?"}]}])
    );
    assert_eq!(body["tools"][0]["name"], "add");
    assert_eq!(
        body["tools"][0]["input_schema"]["properties"]["a"]["type"],
        "integer"
    );
    assert_eq!(
        seen[1].body["messages"],
        json!([
            {"role": "user", "content": [{"type": "text", "text": "2+3?"}]},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Adding."},
                {"type": "tool_use", "id": "toolu_01", "name": "add", "input": {"a": 2, "b": 3}},
            ]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "5"}]},
        ])
    );
}

#[tokio::test]
async fn anthropic_merges_consecutive_turns_and_defaults_max_tokens() {
    let mut turn = vec![anthropic_start(5)];
    turn.push(("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": "ok"}})));
    turn.extend(anthropic_end("end_turn", 1));
    let (base, seen) = fake_server(vec![(
        200,
        "text/event-stream".into(),
        anthropic_sse(&turn),
    )])
    .await;
    let yaml = format!(
        "state: {{messages: messages}}\nmodels:\n  llm: {{provider: anthropic, base_url: \"{base}\", model: claude-test}}\nnodes:\n  model: {{kind: model, model: llm}}\nedges:\n  - {{from: __start__, to: model}}\n"
    );
    let g = Arc::new(load_str(&yaml, "a.yaml", "a", Format::Yaml).unwrap());
    let history = json!([
        {"type": "human", "content": "hi"},
        {"type": "ai", "content": "", "tool_calls": [
            {"name": "add", "args": {"a": 1, "b": 1}, "id": "t1"},
            {"name": "add", "args": {"a": 2, "b": 2}, "id": "t2"},
        ]},
        {"type": "tool", "content": "2", "tool_call_id": "t1"},
        {"type": "tool", "content": "no", "tool_call_id": "t2", "status": "error"},
        {"type": "human", "content": "and?"},
    ]);
    let (out, _) = Harness::new()
        .run(
            &g,
            None,
            RunInput::Values(json!({"messages": history})),
            &[],
            |_| {},
        )
        .await;
    assert_eq!(texts(&out.unwrap().values).last().unwrap(), "ok");
    let body = &seen.lock().unwrap()[0].body;
    assert_eq!(body["max_tokens"], 1024);
    assert!(body.get("system").is_none());
    assert!(body.get("tools").is_none());
    let roles: Vec<&str> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["user", "assistant", "user"]);
    assert_eq!(
        body["messages"][2]["content"],
        json!([
            {"type": "tool_result", "tool_use_id": "t1", "content": "2"},
            {"type": "tool_result", "tool_use_id": "t2", "content": "no", "is_error": true},
            {"type": "text", "text": "and?"},
        ])
    );
}

#[tokio::test]
async fn anthropic_http_and_stream_errors_fail_the_node() {
    std::env::set_var("SPINDLE_TEST_ANTHROPIC_BAD_KEY", "sk-ant-secret");
    let overloaded = anthropic_sse(&[
        anthropic_start(5),
        (
            "error",
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
        ),
    ]);
    let (base, _) = fake_server(vec![
        (401, "application/json".into(), r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#.into()),
        (200, "text/event-stream".into(), overloaded),
    ])
    .await;
    let model = format!(
        r#"{{provider: anthropic, base_url: "{base}", model: claude-test, api_key_env: SPINDLE_TEST_ANTHROPIC_BAD_KEY}}"#
    );
    let (out, _) = run_agent(&agent_with(&model)).await;
    let e = out.unwrap_err();
    assert!(e.contains(&format!("{base}/v1/messages")), "{e}");
    assert!(e.contains("401"), "{e}");
    assert!(e.contains("invalid x-api-key"), "{e}");
    assert!(!e.contains("sk-ant-secret"), "{e}");
    let (out, _) = run_agent(&agent_with(&model)).await;
    let e = out.unwrap_err();
    assert!(e.contains("overloaded_error: Overloaded"), "{e}");
}

fn gemini_sse(responses: &[Value]) -> String {
    responses
        .iter()
        .map(|r| format!("data: {r}\r\n\r\n"))
        .collect()
}

fn gemini_parts(parts: Value, finish: Option<&str>) -> Value {
    let mut candidate = json!({"content": {"role": "model", "parts": parts}, "index": 0});
    if let Some(f) = finish {
        candidate["finishReason"] = json!(f);
    }
    json!({"candidates": [candidate], "modelVersion": "gemini-test-001", "responseId": "r1"})
}

#[tokio::test]
async fn gemini_provider_streams_text_and_function_calls() {
    std::env::set_var("SPINDLE_TEST_GEMINI_KEY", "g-test");
    let mut call = gemini_parts(
        json!([{"functionCall": {"name": "add", "args": {"a": 2, "b": 3}}}]),
        Some("STOP"),
    );
    call["usageMetadata"] =
        json!({"promptTokenCount": 20, "candidatesTokenCount": 5, "totalTokenCount": 25});
    let tool_turn = gemini_sse(&[gemini_parts(json!([{"text": "Adding."}]), None), call]);
    let mut last = gemini_parts(json!([{"text": " 5."}]), Some("STOP"));
    last["usageMetadata"] =
        json!({"promptTokenCount": 40, "candidatesTokenCount": 4, "totalTokenCount": 44});
    let text_turn = gemini_sse(&[
        gemini_parts(json!([{"text": "The sum"}]), None),
        gemini_parts(json!([{"text": " is"}]), None),
        last,
    ]);
    let (base, seen) = fake_server(vec![
        (200, "text/event-stream".into(), tool_turn),
        (200, "text/event-stream".into(), text_turn),
    ])
    .await;
    let model = format!(
        r#"{{provider: gemini, base_url: "{base}", model: gemini-test, api_key_env: SPINDLE_TEST_GEMINI_KEY, params: {{generationConfig: {{temperature: 0}}}}}}"#
    );
    let (out, chunks) = run_agent(&agent_with(&model)).await;
    let v = out.unwrap();
    assert_eq!(texts(&v), ["2+3?", "Adding.", "5", "The sum is 5."]);
    let calls = v["messages"][1]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["name"], "add");
    assert_eq!(calls[0]["args"], json!({"a": 2, "b": 3}));
    let call_id = calls[0]["id"].as_str().unwrap();
    assert!(!call_id.is_empty());
    assert_eq!(v["messages"][2]["tool_call_id"], call_id);
    let answer = &v["messages"][3];
    assert_eq!(answer["response_metadata"]["model_name"], "gemini-test");
    assert_eq!(answer["response_metadata"]["finish_reason"], "STOP");
    assert_eq!(
        answer["usage_metadata"],
        json!({"input_tokens": 40, "output_tokens": 4, "total_tokens": 44})
    );
    let (text, args) = streamed(&chunks);
    assert_eq!(text, "Adding.The sum is 5.");
    assert_eq!(args, ["{\"a\":2,\"b\":3}"]);

    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    assert!(
        seen[0]
            .line
            .starts_with("POST /v1beta/models/gemini-test:streamGenerateContent?alt=sse "),
        "{}",
        seen[0].line
    );
    assert_eq!(header(&seen[0], "x-goog-api-key"), Some("g-test"));
    let body = &seen[0].body;
    assert_eq!(
        body["systemInstruction"],
        json!({"parts": [{"text": "Be brief."}]})
    );
    assert_eq!(
        body["contents"],
        json!([{"role": "user", "parts": [{"text": "2+3?"}]}])
    );
    assert_eq!(body["tools"][0]["functionDeclarations"][0]["name"], "add");
    assert_eq!(
        body["tools"][0]["functionDeclarations"][0]["parameters"]["properties"]["b"]["type"],
        "integer"
    );
    assert_eq!(body["generationConfig"], json!({"temperature": 0}));
    assert_eq!(
        seen[1].body["contents"],
        json!([
            {"role": "user", "parts": [{"text": "2+3?"}]},
            {"role": "model", "parts": [{"text": "Adding."}, {"functionCall": {"name": "add", "args": {"a": 2, "b": 3}}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "add", "response": {"output": "5"}}}]},
        ])
    );
}

#[tokio::test]
async fn gemini_http_errors_name_url_status_and_body() {
    std::env::set_var("SPINDLE_TEST_GEMINI_BAD_KEY", "g-secret");
    let (base, _) = fake_server(vec![(
        400,
        "application/json".into(),
        r#"{"error": {"code": 400, "message": "API key not valid", "status": "INVALID_ARGUMENT"}}"#
            .into(),
    )])
    .await;
    let model = format!(
        r#"{{provider: google_genai, base_url: "{base}", model: gemini-test, api_key_env: SPINDLE_TEST_GEMINI_BAD_KEY}}"#
    );
    let (out, _) = run_agent(&agent_with(&model)).await;
    let e = out.unwrap_err();
    assert!(
        e.contains(&format!(
            "{base}/v1beta/models/gemini-test:streamGenerateContent"
        )),
        "{e}"
    );
    assert!(e.contains("400"), "{e}");
    assert!(e.contains("API key not valid"), "{e}");
    assert!(!e.contains("g-secret"), "{e}");
}

#[tokio::test]
async fn openai_options_reach_azure_style_deployments() {
    std::env::set_var("SPINDLE_TEST_AZURE_KEY", "az-test");
    let mut usage = delta(json!({}));
    usage["choices"] = json!([]);
    usage["usage"] = json!({"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11});
    let mut stop = delta(json!({}));
    stop["choices"][0]["finish_reason"] = json!("stop");
    let reply = sse(&[
        delta(json!({"content": "Hi"})),
        delta(json!({"content": " there"})),
        stop,
        usage,
    ]);
    let (base, seen) = fake_server(vec![(200, "text/event-stream".into(), reply)]).await;
    let model = format!(
        r#"{{provider: openai_compatible, base_url: "{base}/openai/deployments/gpt-4o", model: gpt-4o, api_key_env: SPINDLE_TEST_AZURE_KEY, api_key_header: api-key, query: {{api-version: "2024-10-21"}}, params: {{stream_options: {{include_usage: true}}}}}}"#
    );
    let (out, chunks) = run_agent(&agent_with(&model)).await;
    let v = out.unwrap();
    let answer = &v["messages"][1];
    assert_eq!(answer["content"], "Hi there");
    assert_eq!(answer["response_metadata"]["model_name"], "gpt-4o");
    assert_eq!(answer["response_metadata"]["finish_reason"], "stop");
    assert_eq!(
        answer["usage_metadata"],
        json!({"input_tokens": 9, "output_tokens": 2, "total_tokens": 11})
    );
    assert_eq!(streamed(&chunks).0, "Hi there");
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen[0].line.starts_with(
            "POST /openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21 "
        ),
        "{}",
        seen[0].line
    );
    assert_eq!(header(&seen[0], "api-key"), Some("az-test"));
    assert_eq!(header(&seen[0], "authorization"), None);
    assert_eq!(
        seen[0].body["stream_options"],
        json!({"include_usage": true})
    );
}

#[test]
fn provider_declarations_are_checked() {
    let load = |model: &str| {
        let yaml = agent_with(model);
        load_str(&yaml, "m.yaml", "m", Format::Yaml).map(|_| ())
    };
    let e = load("{provider: anthropic, model: claude-test, api_key: sk-ant-oops}").unwrap_err();
    assert_eq!(e.place, "models.llm.api_key");
    assert!(e.message.contains("unknown key `api_key`"), "{}", e.message);
    let e = load("{provider: gemini, model: g, query: {a: b}}").unwrap_err();
    assert!(e.message.contains("unknown key `query`"), "{}", e.message);
    let e = load("{provider: anthropic}").unwrap_err();
    assert!(e.message.contains("`model`"), "{}", e.message);
    let e = load("{provider: openai_compatible, model: m}").unwrap_err();
    assert!(e.message.contains("`base_url`"), "{}", e.message);
    let e = load("{provider: mistral, model: m}").unwrap_err();
    assert!(
        e.message.contains("anthropic") && e.message.contains("gemini"),
        "{}",
        e.message
    );
    load("{provider: openai, model: gpt-4o-mini}").unwrap();
    load("{provider: google_genai, model: gemini-2.0-flash}").unwrap();
}

#[tokio::test]
async fn gemini_answers_function_calls_by_name_in_one_turn() {
    let reply = gemini_sse(&[gemini_parts(json!([{"text": "ok"}]), Some("STOP"))]);
    let (base, seen) = fake_server(vec![(200, "text/event-stream".into(), reply)]).await;
    let yaml = format!(
        "state: {{messages: messages}}\nmodels:\n  llm: {{provider: gemini, base_url: \"{base}\", model: models/gemini-test}}\nnodes:\n  model: {{kind: model, model: llm}}\nedges:\n  - {{from: __start__, to: model}}\n"
    );
    let g = Arc::new(load_str(&yaml, "g.yaml", "g", Format::Yaml).unwrap());
    // Tool messages without a `name`: the name comes from the call they answer.
    let history = json!([
        {"type": "human", "content": "hi"},
        {"type": "ai", "content": "", "tool_calls": [
            {"name": "add", "args": {"a": 1}, "id": "t1"},
            {"name": "mul", "args": {"a": 2}, "id": "t2"},
        ]},
        {"type": "tool", "content": "4", "tool_call_id": "t2"},
        {"type": "tool", "content": "1", "tool_call_id": "t1"},
    ]);
    let (out, _) = Harness::new()
        .run(
            &g,
            None,
            RunInput::Values(json!({"messages": history})),
            &[],
            |_| {},
        )
        .await;
    assert_eq!(texts(&out.unwrap().values).last().unwrap(), "ok");
    let seen = seen.lock().unwrap().clone();
    // A `models/` prefix on the name is not doubled in the path.
    assert!(
        seen[0]
            .line
            .starts_with("POST /v1beta/models/gemini-test:streamGenerateContent?"),
        "{}",
        seen[0].line
    );
    let body = &seen[0].body;
    assert!(body.get("systemInstruction").is_none());
    assert_eq!(
        body["contents"],
        json!([
            {"role": "user", "parts": [{"text": "hi"}]},
            {"role": "model", "parts": [
                {"functionCall": {"name": "add", "args": {"a": 1}}},
                {"functionCall": {"name": "mul", "args": {"a": 2}}},
            ]},
            {"role": "user", "parts": [
                {"functionResponse": {"name": "mul", "response": {"output": "4"}}},
                {"functionResponse": {"name": "add", "response": {"output": "1"}}},
            ]},
        ])
    );
}

/// Answers one request with `first` as the start of an event stream, then stays silent.
async fn stalling_server(first: String) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let Ok((mut sock, _)) = listener.accept().await else {
            return;
        };
        let mut tmp = [0u8; 4096];
        let _ = sock.read(&mut tmp).await;
        let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
        let chunk = format!("{head}{:x}\r\n{first}\r\n", first.len());
        let _ = sock.write_all(chunk.as_bytes()).await;
        tokio::time::sleep(std::time::Duration::from_secs(60)).await;
    });
    format!("http://{addr}")
}

#[tokio::test]
async fn cancelling_a_run_stops_a_model_stream_midway() {
    let base = stalling_server(anthropic_sse(&[anthropic_start(5)])).await;
    let yaml = agent_with(&format!(
        r#"{{provider: anthropic, base_url: "{base}", model: claude-test}}"#
    ));
    let g = Arc::new(load_str(&yaml, "c.yaml", "c", Format::Yaml).unwrap());
    let cancel = tokio_util::sync::CancellationToken::new();
    let c2 = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        c2.cancel();
    });
    let started = std::time::Instant::now();
    let env = spindle_graph::RunEnv {
        cancel,
        ..Default::default()
    };
    let input = RunInput::Values(json!({"messages": ["hi"]}));
    let out = spindle_graph::pregel::run(&g, input, Default::default(), env).await;
    assert_eq!(out.unwrap_err().class(), "CancelledError");
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
}
