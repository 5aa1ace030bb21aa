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
            let reply = format!(
                "HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{reply_body}",
                reply_body.len()
            );
            let _ = sock.write_all(reply.as_bytes()).await;
            let _ = sock.shutdown().await;
        }
    });
    (format!("http://{addr}"), seen)
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
    format!(
        r#"
state: {{messages: messages}}
models:
  llm: {{provider: openai, base_url: "{base}/v1", model: test-model, api_key_env: SPINDLE_TEST_KEY}}
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
