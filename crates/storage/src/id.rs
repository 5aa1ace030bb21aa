//! The ids of threads and assistants.
//!
//! Spindle generates UUIDs, but a client may name a thread or an assistant it creates (Aegra and
//! the interface take any string; agent UIs use their own conversation ids), so an id is a
//! short string: 1 to [`ResourceId::MAX_LEN`] characters of `[A-Za-z0-9._:-]`. The characters
//! keep ids safe in a URL path, a log line and a LangGraph `configurable` without escaping. An
//! id that parses as a UUID is kept in its canonical form (lowercase, hyphenated), so that the
//! same UUID written in capitals or without hyphens names the same resource, as it did when ids
//! were UUIDs.
//!
//! The id is stored inline (it is `Copy`, as the UUIDs it replaces were), so passing one around
//! costs no allocation.

use std::fmt;
use std::str::FromStr;

use arrayvec::ArrayString;
use uuid::Uuid;

/// A thread's or an assistant's id (see the module's documentation).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceId(ArrayString<{ ResourceId::MAX_LEN }>);

/// Why a string is not an id; the message says what an id is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidId {
    #[error("an id cannot be empty")]
    Empty,
    #[error("an id has at most 128 characters, this one has {0}")]
    TooLong(usize),
    #[error("an id has only letters, digits and . _ : - (found {0:?})")]
    BadCharacter(char),
}

impl ResourceId {
    /// The longest id a client may give.
    pub const MAX_LEN: usize = 128;

    /// A new id: a time-ordered UUID (v7), so that the rows of the resources created together
    /// share B-tree pages.
    pub fn generate() -> Self {
        Self::from_uuid(Uuid::now_v7())
    }

    /// The id a UUID is, in its canonical form.
    pub fn from_uuid(uuid: Uuid) -> Self {
        let mut buffer = Uuid::encode_buffer();
        let text = uuid.hyphenated().encode_lower(&mut buffer);
        Self(ArrayString::from(text).expect("a UUID fits in an id"))
    }

    /// Checks a client's id; a UUID is put in its canonical form.
    pub fn parse(raw: &str) -> Result<Self, InvalidId> {
        if let Ok(uuid) = Uuid::try_parse(raw) {
            return Ok(Self::from_uuid(uuid));
        }
        if raw.is_empty() {
            return Err(InvalidId::Empty);
        }
        if let Some(bad) = raw.chars().find(|c| !is_id_char(*c)) {
            return Err(InvalidId::BadCharacter(bad));
        }
        ArrayString::from(raw)
            .map(Self)
            .map_err(|_| InvalidId::TooLong(raw.chars().count()))
    }

    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

fn is_id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-')
}

impl From<Uuid> for ResourceId {
    fn from(uuid: Uuid) -> Self {
        Self::from_uuid(uuid)
    }
}

impl FromStr for ResourceId {
    type Err = InvalidId;

    fn from_str(raw: &str) -> Result<Self, InvalidId> {
        Self::parse(raw)
    }
}

impl AsRef<str> for ResourceId {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Display for ResourceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for ResourceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl PartialEq<str> for ResourceId {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for ResourceId {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl serde::Serialize for ResourceId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for ResourceId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
        Self::parse(&raw).map_err(|e| serde::de::Error::custom(format!("invalid id: {e}")))
    }
}

// Both backends keep ids as text.

impl<DB: sqlx::Database> sqlx::Type<DB> for ResourceId
where
    String: sqlx::Type<DB>,
{
    fn type_info() -> DB::TypeInfo {
        <String as sqlx::Type<DB>>::type_info()
    }

    fn compatible(ty: &DB::TypeInfo) -> bool {
        <String as sqlx::Type<DB>>::compatible(ty)
    }
}

impl<'q, DB: sqlx::Database> sqlx::Encode<'q, DB> for ResourceId
where
    String: sqlx::Encode<'q, DB>,
{
    fn encode_by_ref(
        &self,
        buf: &mut <DB as sqlx::Database>::ArgumentBuffer<'q>,
    ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
        self.as_str().to_owned().encode(buf)
    }
}

impl<'r, DB: sqlx::Database> sqlx::Decode<'r, DB> for ResourceId
where
    &'r str: sqlx::Decode<'r, DB>,
{
    fn decode(
        value: <DB as sqlx::Database>::ValueRef<'r>,
    ) -> Result<Self, sqlx::error::BoxDynError> {
        let raw = <&str as sqlx::Decode<DB>>::decode(value)?;
        Ok(Self::parse(raw)?)
    }
}

impl sqlx::postgres::PgHasArrayType for ResourceId {
    fn array_type_info() -> sqlx::postgres::PgTypeInfo {
        <String as sqlx::postgres::PgHasArrayType>::array_type_info()
    }
}

impl rusqlite::ToSql for ResourceId {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        Ok(rusqlite::types::ToSqlOutput::Borrowed(
            rusqlite::types::ValueRef::Text(self.as_str().as_bytes()),
        ))
    }
}

impl utoipa::PartialSchema for ResourceId {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length(Some(1))
            .max_length(Some(Self::MAX_LEN))
            .pattern(Some("^[A-Za-z0-9._:-]+$"))
            .description(Some(
                "An id: a UUID when Spindle generated it, or the client's own \
                 (1 to 128 letters, digits and . _ : -)",
            ))
            .into()
    }
}

impl utoipa::ToSchema for ResourceId {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_id_of_letters_digits_and_punctuation_is_kept_as_given() {
        for raw in ["t", "thread-1", "user:42.chat_7", &"x".repeat(128)] {
            assert_eq!(ResourceId::parse(raw).unwrap().as_str(), raw);
        }
    }

    #[test]
    fn a_uuid_in_any_spelling_is_the_same_id() {
        let uuid = Uuid::new_v4();
        let canonical = ResourceId::from_uuid(uuid);
        assert_eq!(canonical.as_str(), uuid.hyphenated().to_string());
        for spelling in [
            uuid.hyphenated().to_string().to_uppercase(),
            uuid.simple().to_string(),
        ] {
            assert_eq!(ResourceId::parse(&spelling).unwrap(), canonical);
        }
    }

    #[test]
    fn ids_that_are_empty_too_long_or_hold_other_characters_are_refused() {
        assert_eq!(ResourceId::parse(""), Err(InvalidId::Empty));
        assert_eq!(
            ResourceId::parse(&"x".repeat(129)),
            Err(InvalidId::TooLong(129))
        );
        for (raw, bad) in [("a b", ' '), ("a/b", '/'), ("é", 'é'), ("a%2f", '%')] {
            assert_eq!(ResourceId::parse(raw), Err(InvalidId::BadCharacter(bad)));
        }
    }

    #[test]
    fn json_carries_an_id_as_its_string_and_checks_it() {
        let id: ResourceId = serde_json::from_str("\"my-thread\"").unwrap();
        assert_eq!(serde_json::to_string(&id).unwrap(), "\"my-thread\"");
        assert!(serde_json::from_str::<ResourceId>("\"no spaces\"").is_err());
        assert!(serde_json::from_str::<ResourceId>("7").is_err());
    }
}
