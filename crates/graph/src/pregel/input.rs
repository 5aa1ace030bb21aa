//! How a run starts: new input (input checkpoint, then the start step), a `Command`
//! (resume values, update, goto), continuing, or time travel from an older checkpoint.

use serde_json::{json, Value};

use super::state::{START_INPUT, TASKS};
use super::{task, Loop, LoopError, Origin, RunError, RunInput, RunOutcome, W_INTERRUPT, W_RESUME};
use crate::checkpoint::PendingWrite;
use crate::graph::START;
use crate::node::Goto;
use crate::stream::StreamMode;

impl Loop {
    pub(super) async fn start(
        &mut self,
        input: RunInput,
        origin: Origin<'_>,
    ) -> Result<RunOutcome, LoopError> {
        let loaded = self.load(origin).await?;
        // Forking from an older checkpoint: new checkpoints hang below it, and writes saved
        // against it belong to the old branch.
        let forked = matches!(origin, Origin::Checkpoint(_));
        let mut skip_interrupt_before = false;
        match input {
            RunInput::Values(v) => {
                let Value::Object(_) = &v else {
                    return Err(RunError::InvalidInput(format!(
                        "Expected dict as the run input, got {v}"
                    ))
                    .into());
                };
                self.pending.clear();
                self.state.sends.clear();
                for i in 0..self.graph.nodes.len() {
                    self.state.seen[i] = self.state.trig[i];
                }
                self.input_checkpoint(v).await?;
                self.start_step().await?;
            }
            RunInput::Command {
                resume,
                update,
                goto,
            } => {
                if loaded.is_none() && resume.is_some() {
                    return Err(RunError::InvalidInput(
                        "Cannot resume: the thread has no checkpoint".into(),
                    )
                    .into());
                }
                if forked {
                    self.pending
                        .retain(|w| w.channel == W_INTERRUPT || w.channel == W_RESUME);
                }
                if update.is_some() || !goto.is_empty() {
                    self.command_step(update, goto).await?;
                } else {
                    self.emit_resume_start().await;
                }
                if let Some(r) = resume {
                    self.record_resume(r).await?;
                }
                skip_interrupt_before = true;
            }
            RunInput::Continue => {
                let forks = match (&loaded, forked) {
                    (Some(metadata), true) => self.forks_from_loaded(metadata).await?,
                    _ => false,
                };
                if forks {
                    // Time travel: like LangGraph, branch off with a `fork` checkpoint (a copy
                    // one step later) and run the old checkpoint's next tasks from there.
                    self.pending.clear();
                    self.emit_values().await;
                    self.step += 1;
                    self.put_checkpoint("fork", Value::Null, Vec::new(), Vec::new())
                        .await?;
                } else {
                    self.emit_resume_start().await;
                }
                skip_interrupt_before = true;
            }
        }
        // A run that died between its input checkpoint and the start step left the input
        // waiting in `__start__`: consume it now.
        if self.state.start_input.is_some() {
            self.start_step().await?;
        }
        self.steps(skip_interrupt_before).await
    }

    /// On resume the reference first shows the state it resumes from.
    pub(super) async fn emit_resume_start(&mut self) {
        if self.checkpoint_id.is_none() {
            return;
        }
        self.emit_values().await;
        if self.run.wants(StreamMode::Checkpoints, &self.ns)
            || self.run.wants(StreamMode::Debug, &self.ns)
        {
            if let (Some(saver), Some(id)) = (&self.saver, &self.checkpoint_id) {
                if let Ok(Some(t)) = saver.get_tuple(self.thread(), &self.ns_str, Some(id)).await {
                    self.emit_checkpoint(&t.metadata).await;
                }
            }
        }
    }

    /// Map a resume value to the interrupted tasks, as `__resume__` writes.
    pub(super) async fn record_resume(&mut self, resume: Value) -> Result<(), LoopError> {
        let interrupted: Vec<(String, Vec<Value>)> = self
            .pending
            .iter()
            .filter(|w| w.channel == W_INTERRUPT)
            .map(|w| {
                (
                    w.task_id.clone(),
                    w.value.as_array().cloned().unwrap_or_default(),
                )
            })
            .collect();
        let by_id = resume.as_object().filter(|m| {
            !m.is_empty()
                && m.keys().all(|k| {
                    interrupted.iter().any(|(_, ints)| {
                        ints.iter()
                            .any(|i| i.get("id").and_then(Value::as_str) == Some(k))
                    })
                })
        });
        let mut new_writes = Vec::new();
        for (task_id, ints) in interrupted {
            let value = match by_id {
                Some(map) => {
                    let hit = ints.iter().find_map(|i| {
                        i.get("id")
                            .and_then(Value::as_str)
                            .and_then(|id| map.get(id))
                    });
                    match hit {
                        Some(v) => v.clone(),
                        None => continue,
                    }
                }
                None => resume.clone(),
            };
            let mut prior: Vec<Value> = self
                .pending
                .iter()
                .find(|w| w.task_id == task_id && w.channel == W_RESUME)
                .and_then(|w| w.value.as_array().cloned())
                .unwrap_or_default();
            prior.push(value);
            new_writes.push(PendingWrite {
                task_id: task_id.clone(),
                channel: W_RESUME.into(),
                value: Value::Array(prior),
            });
        }
        for w in &new_writes {
            self.pending.retain(|p| {
                !(p.task_id == w.task_id && (p.channel == W_RESUME || p.channel == W_INTERRUPT))
            });
            self.pending.push(w.clone());
        }
        self.save_writes(new_writes).await
    }

    /// The `input` checkpoint: the input waits in `__start__`.
    pub(super) async fn input_checkpoint(&mut self, input: Value) -> Result<(), LoopError> {
        self.step += 1;
        let v = self.state.next_version();
        self.state.start_input = Some(input.clone());
        self.state.start_version = v;
        let blob = self.state.bookkeeping_blob(START_INPUT);
        let mut tasks_blob = Vec::new();
        if self.state.sends_version > 0 {
            self.state.sends_version = v;
            tasks_blob.push(self.state.bookkeeping_blob(TASKS));
        }
        let mut blobs = vec![blob];
        blobs.extend(tasks_blob);
        self.put_checkpoint(
            "input",
            json!({START: input}),
            blobs,
            vec![START_INPUT.into()],
        )
        .await
    }

    /// The start step: the input's keys become writes from `__start__`, then `__start__`'s
    /// edges fire. It is not streamed as a task, as in LangGraph.
    pub(super) async fn start_step(&mut self) -> Result<(), LoopError> {
        let input = self.state.start_input.take().unwrap_or(json!({}));
        self.state.start_taken = true;
        let mut writes = Vec::new();
        for (k, v) in input.as_object().into_iter().flatten() {
            if self.graph.input_keys.iter().any(|x| x == k) {
                writes.push((k.clone(), v.clone()));
            }
        }
        // Saved like any task's writes, so history shows the input as the start task's result.
        let start_id = task::task_id(
            self.checkpoint_id.as_deref().unwrap_or_default(),
            &self.ns_str,
            self.step + 1,
            START,
            "pull",
        );
        self.save_writes(task::pending_from(&start_id, &writes))
            .await?;
        let writes = task::normalise_writes(&self.graph, writes)
            .map_err(|e| LoopError::Run(RunError::from_node(e)))?;
        let goto = Vec::new();
        self.apply_start_like(writes, goto, true).await
    }

    /// `Command(update, goto)` as run input: applied like a start step, without its edges.
    pub(super) async fn command_step(
        &mut self,
        update: Option<Value>,
        goto: Vec<Goto>,
    ) -> Result<(), LoopError> {
        let cmd = crate::node::Command {
            update,
            goto: goto.clone(),
            graph: Default::default(),
        };
        let pairs = cmd
            .update_pairs()
            .map_err(|e| LoopError::Run(RunError::from_node(e)))?;
        let writes = task::normalise_writes(&self.graph, pairs)
            .map_err(|e| LoopError::Run(RunError::from_node(e)))?;
        self.apply_start_like(writes, goto, false).await
    }

    pub(super) async fn apply_start_like(
        &mut self,
        writes: Vec<(String, Value)>,
        goto: Vec<Goto>,
        follow_start_edges: bool,
    ) -> Result<(), LoopError> {
        let slot = self.graph.nodes.len();
        // The state is only needed when `__start__` has conditional edges.
        let base = if follow_start_edges && !self.graph.out_branches[slot].is_empty() {
            self.state.state_object(&self.graph)
        } else {
            Value::Null
        };
        let mut routed = Vec::new();
        if follow_start_edges {
            let ctx = self.task_context(
                "__start__",
                START,
                Vec::new(),
                json!(["__pregel_pull", START]),
                Vec::new(),
            );
            routed = task::route(&self.graph, slot, &base, &writes, &[], &ctx)
                .await
                .map_err(|e| {
                    let place = task::route_place(&self.graph, START);
                    LoopError::Run(RunError::from_node(e.at(&place)))
                })?;
        }
        for g in goto {
            routed.extend(
                task::goto_write(&self.graph, &g)
                    .map_err(|e| LoopError::Run(RunError::from_node(e)))?,
            );
        }
        let mut all = writes.clone();
        all.extend(routed);
        let version = self.state.next_version();
        self.step += 1;
        let (blobs, updated) = self.apply_all(&[all], version)?;
        self.emit_values().await;
        let source = if follow_start_edges { "loop" } else { "update" };
        let meta_writes = if follow_start_edges {
            Value::Null
        } else {
            json!({START: Value::Object(writes.into_iter().collect())})
        };
        self.put_checkpoint(source, meta_writes, blobs, updated)
            .await
    }
}
