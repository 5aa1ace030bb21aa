//! Embedders: text to vectors for the store's semantic index.
//!
//! - [`OpenAiEmbedder`]: any OpenAI-compatible `POST {base_url}/embeddings` endpoint.
//! - [`HashEmbedder`]: a deterministic bag-of-words hashing embedder, with no model and no
//!   network: texts sharing words are close. For tests and demos, not for meaning.
//! - `super::minilm::MiniLmEmbedder` (cargo feature `local-embeddings`): a
//!   sentence-transformers MiniLM model read from a local folder and run on the CPU with
//!   candle; works offline.

use std::time::Duration;

use async_trait::async_trait;
use serde_json::{json, Value};

/// Turns texts into vectors, one per text, in order.
#[async_trait]
pub trait Embedder: Send + Sync {
    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, String>;
}

/// Words hashed into `dims` buckets (FNV-1a, with a sign bit), L2-normalised.
pub struct HashEmbedder {
    pub dims: usize,
}

impl HashEmbedder {
    fn embed_one(&self, text: &str) -> Vec<f32> {
        let mut v = vec![0.0f32; self.dims.max(1)];
        for word in text
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
        {
            let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
            for byte in word.to_lowercase().bytes() {
                hash ^= u64::from(byte);
                hash = hash.wrapping_mul(0x0100_0000_01b3);
            }
            let bucket = (hash % v.len() as u64) as usize;
            v[bucket] += if hash >> 63 == 0 { 1.0 } else { -1.0 };
        }
        normalise(&mut v);
        v
    }
}

#[async_trait]
impl Embedder for HashEmbedder {
    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, String> {
        Ok(texts.iter().map(|t| self.embed_one(t)).collect())
    }
}

/// Scales `v` to length 1 (a zero vector stays zero).
pub fn normalise(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
}

/// An OpenAI-compatible embeddings endpoint.
pub struct OpenAiEmbedder {
    client: reqwest::Client,
    /// `https://api.openai.com/v1`, or any server that speaks the same API.
    base_url: String,
    model: String,
    api_key: Option<String>,
    /// Sent as `dimensions` (models that can shorten their vectors honour it).
    dimensions: Option<usize>,
}

impl OpenAiEmbedder {
    pub fn new(
        base_url: impl Into<String>,
        model: impl Into<String>,
        api_key: Option<String>,
        dimensions: Option<usize>,
    ) -> Result<Self, String> {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Self {
            client,
            base_url: base_url.into().trim_end_matches('/').to_owned(),
            model: model.into(),
            api_key,
            dimensions,
        })
    }
}

#[async_trait]
impl Embedder for OpenAiEmbedder {
    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, String> {
        let mut body = json!({"model": self.model, "input": texts});
        if let Some(d) = self.dimensions {
            body["dimensions"] = json!(d);
        }
        let mut request = self
            .client
            .post(format!("{}/embeddings", self.base_url))
            .json(&body);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        let response = request
            .send()
            .await
            .map_err(|e| format!("embeddings request failed: {e}"))?;
        let status = response.status();
        let answer: Value = response
            .json()
            .await
            .map_err(|e| format!("embeddings endpoint answered {status} with no JSON: {e}"))?;
        if !status.is_success() {
            return Err(format!("embeddings endpoint answered {status}: {answer}"));
        }
        parse_openai(&answer, texts.len())
    }
}

/// `{"data": [{"index": i, "embedding": [...]}, ...]}`, put back in input order.
fn parse_openai(answer: &Value, count: usize) -> Result<Vec<Vec<f32>>, String> {
    let data = answer
        .get("data")
        .and_then(Value::as_array)
        .ok_or("the embeddings answer has no data list")?;
    let mut out = vec![Vec::new(); count];
    for (position, item) in data.iter().enumerate() {
        let index = item
            .get("index")
            .and_then(Value::as_u64)
            .map_or(position, |i| i as usize);
        let embedding = item
            .get("embedding")
            .and_then(Value::as_array)
            .ok_or("an embeddings item has no embedding list")?
            .iter()
            .map(|x| x.as_f64().map(|x| x as f32))
            .collect::<Option<Vec<f32>>>()
            .ok_or("an embedding holds something that is not a number")?;
        *out.get_mut(index)
            .ok_or("an embedding index is out of range")? = embedding;
    }
    if out.iter().any(Vec::is_empty) {
        return Err("the embeddings answer misses some inputs".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cosine(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    #[tokio::test]
    async fn hashing_puts_shared_words_close() {
        let e = HashEmbedder { dims: 64 };
        let v = e
            .embed(&[
                "the cat sat on the mat".into(),
                "a cat on a mat".into(),
                "stock prices fell sharply".into(),
            ])
            .await
            .unwrap();
        assert!(cosine(&v[0], &v[1]) > cosine(&v[0], &v[2]));
        assert_eq!(
            v,
            e.embed(&[
                "the cat sat on the mat".into(),
                "a cat on a mat".into(),
                "stock prices fell sharply".into()
            ])
            .await
            .unwrap()
        );
    }

    #[test]
    fn openai_answers_are_put_in_input_order() {
        let answer = json!({"data": [
            {"index": 1, "embedding": [0.0, 1.0]},
            {"index": 0, "embedding": [1.0, 0.0]},
        ]});
        assert_eq!(
            parse_openai(&answer, 2).unwrap(),
            vec![vec![1.0, 0.0], vec![0.0, 1.0]]
        );
        assert!(parse_openai(&json!({"data": []}), 1).is_err());
    }
}
