//! Prebuilt graphs: the model-plus-tools agent loop (LangGraph's `create_react_agent`).

use std::sync::Arc;

use crate::builder::{BuildError, GraphBuilder};
use crate::channels::{ChannelKind, ChannelSpec};
use crate::graph::{Graph, END, START};
use crate::nodes::{ModelNode, NodeModel, ToolsCondition, ToolsNode};
use crate::tools::Tool;

/// `{messages}` graph: `agent` calls the model; when it asks for tools, `tools` runs them and
/// the model is called again, until it answers without tool calls.
pub fn agent_graph(
    name: &str,
    model: NodeModel,
    tools: Vec<Arc<Tool>>,
    system: Option<String>,
    stream: bool,
) -> Result<Graph, BuildError> {
    let schemas = tools.iter().map(|t| t.schema.clone()).collect();
    let mut b = GraphBuilder::new(name)
        .channel(ChannelSpec::new("messages", ChannelKind::Messages))
        .node(
            "agent",
            Arc::new(ModelNode {
                model,
                tools: schemas,
                system,
                stream,
                messages_key: "messages".into(),
            }),
        )
        .edge(START, "agent");
    if tools.is_empty() {
        b = b.edge("agent", END);
    } else {
        b = b
            .node(
                "tools",
                Arc::new(ToolsNode {
                    tools,
                    messages_key: "messages".into(),
                }),
            )
            .branch(
                "agent",
                Arc::new(ToolsCondition {
                    messages_key: "messages".into(),
                    tools_node: "tools".into(),
                }),
                None,
                Some(vec!["tools".into(), END.into()]),
            )
            .edge("tools", "agent");
    }
    b.compile()
}
