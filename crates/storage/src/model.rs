//! Typed records and requests that cross the storage boundary.
//!
//! These are domain values, not wire types: the server crate maps them to and from JSON bodies.

use crate::ResourceId;
use chrono::{DateTime, Utc};
use serde_json::{Map, Value};
use spindle_graph::checkpoint::{ChannelBlob, Checkpoint};

/// A JSON object, as metadata, config and context are.
pub type JsonObject = Map<String, Value>;

/// The identity every storage call acts for.
///
/// Queries filter by it so that a resource of another user simply does not exist (404).
/// Resources created by the server itself (the default assistants) have no owner and are
/// visible to every user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    pub user_id: String,
}

impl Scope {
    /// The single user every request acts as until authentication is configured.
    pub const LOCAL_USER: &'static str = "anonymous";

    pub fn new(user_id: impl Into<String>) -> Self {
        Self {
            user_id: user_id.into(),
        }
    }

    pub fn local() -> Self {
        Self::new(Self::LOCAL_USER)
    }
}

/// A condition on a resource's metadata beyond the client's own containment filter:
/// containments combined with "all of" and "any of". The server translates LangGraph's
/// custom-auth filters (`$eq`, `$contains`, `$and`, `$or`) into it, so that a search applies
/// them in the database and a resource already read is checked by [`MetadataCondition::holds`],
/// with the same meaning.
#[derive(Debug, Clone, PartialEq)]
pub enum MetadataCondition {
    /// The metadata contains this JSON value (jsonb `@>`).
    Contains(Value),
    /// Every condition holds (true when there is none).
    All(Vec<MetadataCondition>),
    /// Some condition holds (false when there is none).
    Any(Vec<MetadataCondition>),
}

impl MetadataCondition {
    /// Whether `metadata` meets the condition.
    pub fn holds(&self, metadata: &Value) -> bool {
        match self {
            MetadataCondition::Contains(wanted) => crate::json_contains(metadata, wanted),
            MetadataCondition::All(all) => all.iter().all(|c| c.holds(metadata)),
            MetadataCondition::Any(any) => any.iter().any(|c| c.holds(metadata)),
        }
    }
}

/// Who created a new resource: a user, or the server itself (shared with every user).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner<'a> {
    User(&'a Scope),
    System,
}

impl Owner<'_> {
    pub fn user_id(&self) -> Option<&str> {
        match self {
            Owner::User(scope) => Some(&scope.user_id),
            Owner::System => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SortOrder {
    Asc,
    #[default]
    Desc,
}

impl SortOrder {
    pub fn sql(self) -> &'static str {
        match self {
            SortOrder::Asc => "ASC",
            SortOrder::Desc => "DESC",
        }
    }
}

/// What to do when a resource with the requested id already exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IfExists {
    #[default]
    Raise,
    DoNothing,
}

// ---------------------------------------------------------------------------------------------
// Assistants
// ---------------------------------------------------------------------------------------------

/// The configurable part of an assistant; each version holds one.
#[derive(Debug, Clone, PartialEq)]
pub struct AssistantFields {
    pub graph_id: String,
    pub name: String,
    pub description: Option<String>,
    pub config: JsonObject,
    pub context: JsonObject,
    pub metadata: JsonObject,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Assistant {
    pub assistant_id: ResourceId,
    pub user_id: Option<String>,
    /// The version runs use: the latest, unless another was pinned with set-latest.
    pub version: i64,
    pub fields: AssistantFields,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// Which state of an assistant something was made from: its current version and when the
/// assistant last changed (every update, version change and re-creation moves `updated_at`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AssistantRead {
    pub version: i64,
    pub updated_at: DateTime<Utc>,
}

impl AssistantRead {
    pub fn of(assistant: &Assistant) -> Self {
        Self {
            version: assistant.version,
            updated_at: assistant.updated_at,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct AssistantVersion {
    pub assistant_id: ResourceId,
    pub version: i64,
    pub fields: AssistantFields,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone)]
pub struct NewAssistant {
    pub assistant_id: ResourceId,
    pub fields: AssistantFields,
    pub if_exists: IfExists,
}

/// A partial update. `None` leaves a field unchanged; the rules for clearing live in the server,
/// which turns the wire's null/empty forms into concrete values here.
#[derive(Debug, Clone, Default)]
pub struct AssistantPatch {
    pub graph_id: Option<String>,
    pub name: Option<String>,
    /// `Some(None)` clears the description.
    pub description: Option<Option<String>>,
    /// Replaces the config (an empty object clears it).
    pub config: Option<JsonObject>,
    /// Replaces the context.
    pub context: Option<JsonObject>,
    /// Merged key by key into the existing metadata.
    pub metadata: Option<JsonObject>,
}

impl AssistantPatch {
    /// The fields of the next version: the current ones with this patch applied.
    pub fn apply(&self, current: &AssistantFields) -> AssistantFields {
        let mut metadata = current.metadata.clone();
        if let Some(patch) = &self.metadata {
            metadata.extend(patch.clone());
        }
        AssistantFields {
            graph_id: self
                .graph_id
                .clone()
                .unwrap_or_else(|| current.graph_id.clone()),
            name: self.name.clone().unwrap_or_else(|| current.name.clone()),
            description: match &self.description {
                Some(d) => d.clone(),
                None => current.description.clone(),
            },
            config: self
                .config
                .clone()
                .unwrap_or_else(|| current.config.clone()),
            context: self
                .context
                .clone()
                .unwrap_or_else(|| current.context.clone()),
            metadata,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AssistantSortBy {
    AssistantId,
    GraphId,
    Name,
    #[default]
    CreatedAt,
    UpdatedAt,
}

impl AssistantSortBy {
    pub fn column(self) -> &'static str {
        match self {
            AssistantSortBy::AssistantId => "assistant_id",
            AssistantSortBy::GraphId => "graph_id",
            AssistantSortBy::Name => "name",
            AssistantSortBy::CreatedAt => "created_at",
            AssistantSortBy::UpdatedAt => "updated_at",
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct AssistantFilter {
    pub graph_id: Option<String>,
    /// Case-insensitive substring of the name.
    pub name: Option<String>,
    /// Containment: every key/value given must be present in the assistant's metadata.
    pub metadata: Option<JsonObject>,
    /// A further condition on the metadata (a custom-auth handler's filter).
    pub condition: Option<MetadataCondition>,
}

#[derive(Debug, Clone)]
pub struct Page {
    pub limit: i64,
    pub offset: i64,
}

#[derive(Debug, Clone)]
pub struct AssistantSearch {
    pub filter: AssistantFilter,
    pub sort_by: AssistantSortBy,
    pub sort_order: SortOrder,
    pub page: Page,
}

// ---------------------------------------------------------------------------------------------
// Threads
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ThreadStatus {
    #[default]
    Idle,
    Busy,
    Interrupted,
    Error,
}

impl ThreadStatus {
    pub const ALL: [ThreadStatus; 4] = [
        ThreadStatus::Idle,
        ThreadStatus::Busy,
        ThreadStatus::Interrupted,
        ThreadStatus::Error,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ThreadStatus::Idle => "idle",
            ThreadStatus::Busy => "busy",
            ThreadStatus::Interrupted => "interrupted",
            ThreadStatus::Error => "error",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|status| status.as_str() == s)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Thread {
    pub thread_id: ResourceId,
    pub user_id: Option<String>,
    pub status: ThreadStatus,
    pub metadata: JsonObject,
    pub config: JsonObject,
    /// The values of the latest checkpoint; `None` until a run or a state update wrote one.
    pub values: Option<Value>,
    pub interrupts: JsonObject,
    pub error: Option<Value>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub state_updated_at: DateTime<Utc>,
    /// The thread's own time to live, when it has one.
    pub ttl: Option<ThreadTtl>,
    /// When its own TTL runs out (the sweeper then applies its strategy).
    pub expires_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone)]
pub struct NewThread {
    pub thread_id: ResourceId,
    pub metadata: JsonObject,
    pub if_exists: IfExists,
    /// Expire the thread this long after its creation.
    pub ttl: Option<ThreadTtl>,
    /// Checkpoints to start the thread with (supersteps), saved in the creating transaction.
    /// Not applied when an existing thread is returned (`IfExists::DoNothing`).
    pub state: Option<StateWrite>,
}

impl NewThread {
    /// A thread with only an id and metadata.
    pub fn new(thread_id: ResourceId, metadata: JsonObject, if_exists: IfExists) -> Self {
        Self {
            thread_id,
            metadata,
            if_exists,
            ttl: None,
            state: None,
        }
    }
}

/// A change of a thread's metadata and TTL.
#[derive(Debug, Clone, Default)]
pub struct ThreadPatch {
    /// Merged key by key into the existing metadata.
    pub metadata: JsonObject,
    /// Replaces the thread's TTL (counted from now) when given.
    pub ttl: Option<ThreadTtl>,
}

/// What happens to a thread when its time to live runs out (or when it is pruned).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TtlStrategy {
    /// The thread goes, with its runs, events and checkpoints.
    #[default]
    Delete,
    /// The thread stays with only its latest checkpoint (of each namespace).
    KeepLatest,
}

impl TtlStrategy {
    pub fn as_str(self) -> &'static str {
        match self {
            TtlStrategy::Delete => "delete",
            TtlStrategy::KeepLatest => "keep_latest",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [Self::Delete, Self::KeepLatest]
            .into_iter()
            .find(|t| t.as_str() == s)
    }
}

/// A thread's time to live: `minutes` (fractions allowed) from when it was set.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ThreadTtl {
    pub strategy: TtlStrategy,
    pub minutes: f64,
}

impl ThreadTtl {
    /// When a TTL set at `from` runs out.
    pub fn expiry(&self, from: DateTime<Utc>) -> DateTime<Utc> {
        minutes_after(from, self.minutes)
    }
}

/// `minutes` (fractions allowed, negatives as 0) after `from`, saturating at the latest time
/// there is.
pub fn minutes_after(from: DateTime<Utc>, minutes: f64) -> DateTime<Utc> {
    let micros = (minutes * 60_000_000.0).clamp(0.0, 1e17) as i64;
    from.checked_add_signed(chrono::Duration::microseconds(micros))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// One checkpoint to save as part of a thread change (a state update, supersteps).
#[derive(Debug, Clone)]
pub struct CheckpointWrite {
    pub checkpoint_ns: String,
    /// The checkpoint as saved (its values travel in `blobs`).
    pub checkpoint: Checkpoint,
    pub metadata: Value,
    pub parent_id: Option<String>,
    pub blobs: Vec<ChannelBlob>,
}

/// The thread's columns that follow its latest checkpoint, as a run's end writes them.
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadStateColumns {
    /// `interrupted` when the checkpoint has next tasks, else `idle`.
    pub status: ThreadStatus,
    pub values: Option<Value>,
    /// Interrupts by task id.
    pub interrupts: JsonObject,
}

/// Checkpoints to save, in order, and the thread's state once they are.
#[derive(Debug, Clone)]
pub struct StateWrite {
    pub checkpoints: Vec<CheckpointWrite>,
    pub columns: ThreadStateColumns,
    /// When the edit was computed from the thread's latest checkpoint of its namespace (the
    /// root's, or a subgraph's): that checkpoint's id (`None` inside: there was none). The
    /// write is a `Conflict` if another one became the latest meanwhile (a run started and
    /// ended between the read and the write).
    pub expect_latest: Option<Option<String>>,
}

impl StateWrite {
    /// The namespace the edit writes in (`""`, the root graph's, when it writes nothing).
    pub fn namespace(&self) -> &str {
        self.checkpoints
            .first()
            .map_or("", |c| c.checkpoint_ns.as_str())
    }
}

/// An event to append to the thread's log with a state change (no run made it).
#[derive(Debug, Clone)]
pub struct ThreadEvent {
    pub event: String,
    pub data: Value,
}

/// A thread after a state change, with the event logged for it.
#[derive(Debug, Clone)]
pub struct StateWritten {
    pub thread: Thread,
    pub event: Option<crate::LoggedEvent>,
}

/// What one sweep of expired threads did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepOutcome {
    /// Threads removed (`delete`).
    pub deleted: u64,
    /// Threads cut down to their latest checkpoints (`keep_latest`).
    pub trimmed: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ThreadSortBy {
    ThreadId,
    Status,
    CreatedAt,
    #[default]
    UpdatedAt,
    StateUpdatedAt,
}

impl ThreadSortBy {
    pub fn column(self) -> &'static str {
        match self {
            ThreadSortBy::ThreadId => "thread_id",
            ThreadSortBy::Status => "status",
            ThreadSortBy::CreatedAt => "created_at",
            ThreadSortBy::UpdatedAt => "updated_at",
            ThreadSortBy::StateUpdatedAt => "state_updated_at",
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct ThreadFilter {
    pub ids: Option<Vec<ResourceId>>,
    pub metadata: Option<JsonObject>,
    pub values: Option<JsonObject>,
    pub status: Option<ThreadStatus>,
    /// A further condition on the metadata (a custom-auth handler's filter).
    pub condition: Option<MetadataCondition>,
}

#[derive(Debug, Clone)]
pub struct ThreadSearch {
    pub filter: ThreadFilter,
    pub sort_by: ThreadSortBy,
    pub sort_order: SortOrder,
    pub page: Page,
}

/// One page of results with the number of matches across all pages.
#[derive(Debug, Clone)]
pub struct Paged<T> {
    pub items: Vec<T>,
    pub total: i64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> JsonObject {
        v.as_object().cloned().unwrap()
    }

    fn fields() -> AssistantFields {
        AssistantFields {
            graph_id: "echo".into(),
            name: "a".into(),
            description: Some("d".into()),
            config: obj(json!({"configurable": {"x": 1}})),
            context: obj(json!({"c": 1})),
            metadata: obj(json!({"k": 1, "keep": true})),
        }
    }

    #[test]
    fn patch_merges_metadata_and_replaces_config() {
        let patch = AssistantPatch {
            metadata: Some(obj(json!({"k": 2, "new": "v"}))),
            config: Some(JsonObject::new()),
            ..Default::default()
        };
        let next = patch.apply(&fields());
        assert_eq!(
            Value::Object(next.metadata),
            json!({"k": 2, "keep": true, "new": "v"})
        );
        assert!(next.config.is_empty());
        assert_eq!(next.context, fields().context);
        assert_eq!(next.description.as_deref(), Some("d"));
    }

    #[test]
    fn patch_clears_description() {
        let patch = AssistantPatch {
            description: Some(None),
            ..Default::default()
        };
        assert_eq!(patch.apply(&fields()).description, None);
    }

    #[test]
    fn ttl_expiry_counts_fractional_minutes() {
        let ttl = ThreadTtl {
            strategy: TtlStrategy::Delete,
            minutes: 0.02,
        };
        let from = Utc::now();
        assert_eq!(
            ttl.expiry(from) - from,
            chrono::Duration::milliseconds(1200)
        );
        assert_eq!(
            TtlStrategy::parse("keep_latest"),
            Some(TtlStrategy::KeepLatest)
        );
        assert_eq!(TtlStrategy::parse("zap"), None);
    }

    #[test]
    fn thread_status_round_trips() {
        for status in ThreadStatus::ALL {
            assert_eq!(ThreadStatus::parse(status.as_str()), Some(status));
        }
        assert_eq!(ThreadStatus::parse("bogus"), None);
    }
}
