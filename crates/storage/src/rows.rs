//! Row shapes shared by both backends.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::types::Json;
use uuid::Uuid;

use crate::model::{
    Assistant, AssistantFields, AssistantVersion, JsonObject, Thread, ThreadStatus, ThreadTtl,
    TtlStrategy,
};
use crate::{ResourceId, StorageError, StorageResult};

/// A UUID id (a run's, a cron's) as a backend decodes it: PostgreSQL `UUID`, SQLite `TEXT`.
pub(crate) trait IntoUuid {
    fn into_uuid(self) -> Uuid;
}

impl IntoUuid for Uuid {
    fn into_uuid(self) -> Uuid {
        self
    }
}

impl IntoUuid for uuid::fmt::Hyphenated {
    fn into_uuid(self) -> Uuid {
        uuid::fmt::Hyphenated::into_uuid(self)
    }
}

#[derive(sqlx::FromRow)]
pub(crate) struct AssistantRow {
    assistant_id: ResourceId,
    user_id: Option<String>,
    graph_id: String,
    name: String,
    description: Option<String>,
    config: Json<JsonObject>,
    context: Json<JsonObject>,
    metadata: Json<JsonObject>,
    version: i64,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

impl AssistantRow {
    /// A row read by rusqlite (the SQLite writer thread and point reads).
    pub(crate) fn from_sqlite(r: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        use crate::sqlite_values::RowExt;
        Ok(Self {
            assistant_id: r.resource_id("assistant_id")?,
            user_id: r.get("user_id")?,
            graph_id: r.get("graph_id")?,
            name: r.get("name")?,
            description: r.get("description")?,
            config: Json(r.json("config")?),
            context: Json(r.json("context")?),
            metadata: Json(r.json("metadata")?),
            version: r.get("version")?,
            created_at: r.ts("created_at")?,
            updated_at: r.ts("updated_at")?,
        })
    }
}

impl From<AssistantRow> for Assistant {
    fn from(row: AssistantRow) -> Self {
        Assistant {
            assistant_id: row.assistant_id,
            user_id: row.user_id,
            version: row.version,
            fields: AssistantFields {
                graph_id: row.graph_id,
                name: row.name,
                description: row.description,
                config: row.config.0,
                context: row.context.0,
                metadata: row.metadata.0,
            },
            created_at: row.created_at,
            updated_at: row.updated_at,
        }
    }
}

#[derive(sqlx::FromRow)]
pub(crate) struct AssistantVersionRow {
    assistant_id: ResourceId,
    version: i64,
    graph_id: String,
    name: String,
    description: Option<String>,
    config: Json<JsonObject>,
    context: Json<JsonObject>,
    metadata: Json<JsonObject>,
    created_at: DateTime<Utc>,
}

impl From<AssistantVersionRow> for AssistantVersion {
    fn from(row: AssistantVersionRow) -> Self {
        AssistantVersion {
            assistant_id: row.assistant_id,
            version: row.version,
            fields: AssistantFields {
                graph_id: row.graph_id,
                name: row.name,
                description: row.description,
                config: row.config.0,
                context: row.context.0,
                metadata: row.metadata.0,
            },
            created_at: row.created_at,
        }
    }
}

#[derive(sqlx::FromRow)]
pub(crate) struct ThreadRow {
    thread_id: ResourceId,
    user_id: Option<String>,
    status: String,
    metadata: Json<JsonObject>,
    config: Json<JsonObject>,
    state_values: Option<Json<Value>>,
    interrupts: Json<JsonObject>,
    error: Option<Json<Value>>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    state_updated_at: DateTime<Utc>,
    ttl_strategy: Option<String>,
    ttl_minutes: Option<f64>,
    expires_at: Option<DateTime<Utc>>,
}

impl ThreadRow {
    /// A row read by rusqlite (the SQLite writer thread and point reads).
    pub(crate) fn from_sqlite(r: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        use crate::sqlite_values::RowExt;
        Ok(Self {
            thread_id: r.resource_id("thread_id")?,
            user_id: r.get("user_id")?,
            status: r.get("status")?,
            metadata: Json(r.json("metadata")?),
            config: Json(r.json("config")?),
            state_values: r.opt_json("state_values")?.map(Json),
            interrupts: Json(r.json("interrupts")?),
            error: r.opt_json("error")?.map(Json),
            created_at: r.ts("created_at")?,
            updated_at: r.ts("updated_at")?,
            state_updated_at: r.ts("state_updated_at")?,
            ttl_strategy: r.get("ttl_strategy")?,
            ttl_minutes: r.get("ttl_minutes")?,
            expires_at: r.opt_ts("expires_at")?,
        })
    }
}

impl TryFrom<ThreadRow> for Thread {
    type Error = StorageError;

    fn try_from(row: ThreadRow) -> StorageResult<Self> {
        let status = ThreadStatus::parse(&row.status).ok_or_else(|| {
            StorageError::Corrupt(format!("unknown thread status {:?}", row.status))
        })?;
        Ok(Thread {
            thread_id: row.thread_id,
            user_id: row.user_id,
            status,
            metadata: row.metadata.0,
            config: row.config.0,
            values: row.state_values.map(|v| v.0),
            interrupts: row.interrupts.0,
            error: row.error.map(|v| v.0),
            created_at: row.created_at,
            updated_at: row.updated_at,
            state_updated_at: row.state_updated_at,
            ttl: match (row.ttl_strategy, row.ttl_minutes) {
                (Some(strategy), Some(minutes)) => Some(ThreadTtl {
                    strategy: TtlStrategy::parse(&strategy).ok_or_else(|| {
                        StorageError::Corrupt(format!("unknown TTL strategy {strategy:?}"))
                    })?,
                    minutes,
                }),
                _ => None,
            },
            expires_at: row.expires_at,
        })
    }
}

pub(crate) const ASSISTANT_COLUMNS: &str = "assistant_id, user_id, graph_id, name, description, \
     config, context, metadata, version, created_at, updated_at";

pub(crate) const VERSION_COLUMNS: &str = "assistant_id, version, graph_id, name, description, \
     config, context, metadata, created_at";

pub(crate) const THREAD_COLUMNS: &str = "thread_id, user_id, status, metadata, config, \
     state_values, interrupts, error, created_at, updated_at, state_updated_at, ttl_strategy, \
     ttl_minutes, expires_at";
