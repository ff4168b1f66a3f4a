//! Prompt tokens: exact ids with a tokenizer (`serve --tokenizer tokenizer.json`, the HF
//! format), otherwise estimated at about four characters per token, each estimated token an id
//! derived from its characters (so equal text gives equal ids, and prefix caching sees shared
//! prefixes either way). Chat prompts are counted
//! as the DeepSeek chat template renders them: BOS, the system prompt (with the tool list),
//! then `<｜User｜>`, `<｜Assistant｜>` … `<｜end▁of▁sentence｜>` and tool-output turns, and the
//! generation prompt `<｜Assistant｜>`; every template marker is one special token.

use crate::text;
use std::path::Path;

pub const BOS: &str = "<｜begin▁of▁sentence｜>";
pub const EOS: &str = "<｜end▁of▁sentence｜>";
pub const USER: &str = "<｜User｜>";
pub const ASSISTANT: &str = "<｜Assistant｜>";
pub const TOOL_OUTPUTS_BEGIN: &str = "<｜tool▁outputs▁begin｜>";
pub const TOOL_OUTPUTS_END: &str = "<｜tool▁outputs▁end｜>";
pub const TOOL_OUTPUT_BEGIN: &str = "<｜tool▁output▁begin｜>";
pub const TOOL_OUTPUT_END: &str = "<｜tool▁output▁end｜>";
pub const TOOL_CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
pub const TOOL_CALLS_END: &str = "<｜tool▁calls▁end｜>";
pub const TOOL_CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
pub const TOOL_CALL_END: &str = "<｜tool▁call▁end｜>";
pub const TOOL_SEP: &str = "<｜tool▁sep｜>";

/// A piece of a rendered chat prompt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Segment {
    /// A template marker: one token.
    Special(&'static str),
    Text(String),
}

/// A chat message, as the template needs it.
#[derive(Clone, Debug, Default)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// An assistant turn's tool calls: (name, arguments).
    pub tool_calls: Vec<(String, String)>,
}

/// Renders messages the way DeepSeek's V3/V3.1 chat template lays them out (structure, not
/// the exact wording around tool descriptions).
pub fn render_chat(messages: &[ChatMessage], tools_json: Option<&str>) -> Vec<Segment> {
    let mut out = vec![Segment::Special(BOS)];
    let system: Vec<&str> = messages
        .iter()
        .filter(|m| m.role == "system" || m.role == "developer")
        .map(|m| m.content.as_str())
        .collect();
    let mut sys = system.join("\n\n");
    if let Some(t) = tools_json {
        sys.push_str("\n\n## Tools\n\nYou have access to the following tools:\n\n");
        sys.push_str(t);
    }
    if !sys.is_empty() {
        out.push(Segment::Text(sys));
    }
    let mut in_tool_outputs = false;
    for m in messages {
        if m.role != "tool" && in_tool_outputs {
            out.push(Segment::Special(TOOL_OUTPUTS_END));
            in_tool_outputs = false;
        }
        match m.role.as_str() {
            "system" | "developer" => {}
            "user" => {
                out.push(Segment::Special(USER));
                out.push(Segment::Text(m.content.clone()));
            }
            "assistant" => {
                out.push(Segment::Special(ASSISTANT));
                if !m.content.is_empty() {
                    out.push(Segment::Text(m.content.clone()));
                }
                if !m.tool_calls.is_empty() {
                    out.push(Segment::Special(TOOL_CALLS_BEGIN));
                    for (name, args) in &m.tool_calls {
                        out.push(Segment::Special(TOOL_CALL_BEGIN));
                        out.push(Segment::Text(name.clone()));
                        out.push(Segment::Special(TOOL_SEP));
                        out.push(Segment::Text(args.clone()));
                        out.push(Segment::Special(TOOL_CALL_END));
                    }
                    out.push(Segment::Special(TOOL_CALLS_END));
                }
                out.push(Segment::Special(EOS));
            }
            // "tool" and "function" results.
            _ => {
                if !in_tool_outputs {
                    out.push(Segment::Special(TOOL_OUTPUTS_BEGIN));
                    in_tool_outputs = true;
                }
                out.push(Segment::Special(TOOL_OUTPUT_BEGIN));
                out.push(Segment::Text(m.content.clone()));
                out.push(Segment::Special(TOOL_OUTPUT_END));
            }
        }
    }
    if in_tool_outputs {
        out.push(Segment::Special(TOOL_OUTPUTS_END));
    }
    out.push(Segment::Special(ASSISTANT));
    out
}

/// A tokenizer file that could not be used.
#[derive(Debug, thiserror::Error)]
#[error("cannot load the tokenizer {path}: {reason}")]
pub struct TokenizerError {
    pub path: String,
    pub reason: String,
}

/// How prompts are counted.
pub enum Counter {
    /// About four characters per token; template markers one each.
    Estimate,
    /// A real tokenizer.
    Tokenizer(std::sync::Arc<tokenizers::Tokenizer>),
}

impl Counter {
    /// Loads an HF `tokenizer.json`.
    pub fn from_file(path: &Path) -> Result<Counter, TokenizerError> {
        let t = tokenizers::Tokenizer::from_file(path).map_err(|e| TokenizerError {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        Ok(Counter::Tokenizer(std::sync::Arc::new(t)))
    }

    /// The tokenizer, when there is one (output text is decoded with it).
    pub fn tokenizer(&self) -> Option<&std::sync::Arc<tokenizers::Tokenizer>> {
        match self {
            Counter::Estimate => None,
            Counter::Tokenizer(t) => Some(t),
        }
    }

    /// Token ids the tokenizer knows (special tokens included); `None` without one.
    pub fn vocab_size(&self) -> Option<u64> {
        match self {
            Counter::Estimate => None,
            Counter::Tokenizer(t) => Some(t.get_vocab_size(true) as u64),
        }
    }

    /// Tokens of a completion prompt (with the tokenizer's own special tokens, e.g. BOS).
    pub fn count_text(&self, s: &str) -> u32 {
        self.encode_text(s).len() as u32
    }

    /// Token ids of a completion prompt.
    pub fn encode_text(&self, s: &str) -> Vec<u32> {
        match self {
            Counter::Estimate => text::estimate_ids(s),
            Counter::Tokenizer(t) => t
                .encode_fast(s, true)
                .map_or_else(|_| text::estimate_ids(s), |e| e.get_ids().to_vec()),
        }
    }

    /// Tokens of a rendered chat prompt.
    pub fn count_chat(&self, segments: &[Segment]) -> u32 {
        self.encode_chat(segments).len() as u32
    }

    /// Token ids of a rendered chat prompt.
    pub fn encode_chat(&self, segments: &[Segment]) -> Vec<u32> {
        match self {
            Counter::Estimate => estimate_chat(segments),
            Counter::Tokenizer(t) => {
                let whole: String = segments
                    .iter()
                    .map(|s| match s {
                        Segment::Special(x) => *x,
                        Segment::Text(x) => x.as_str(),
                    })
                    .collect();
                // The template already holds BOS: no special tokens added.
                t.encode_fast(whole.as_str(), false)
                    .map_or_else(|_| estimate_chat(segments), |e| e.get_ids().to_vec())
            }
        }
    }
}

/// Estimated ids of a chat prompt: a template marker is one token (an id of its own), text
/// about four characters a token.
fn estimate_chat(segments: &[Segment]) -> Vec<u32> {
    let mut out = Vec::new();
    for s in segments {
        match s {
            Segment::Special(x) => out.push(text::marker_id(x)),
            Segment::Text(t) if t.is_empty() => {}
            Segment::Text(t) => out.extend(text::estimate_ids(t)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            tool_calls: vec![],
        }
    }

    #[test]
    fn template_structure() {
        let s = render_chat(&[msg("system", "be brief"), msg("user", "hi")], None);
        assert_eq!(
            s,
            vec![
                Segment::Special(BOS),
                Segment::Text("be brief".into()),
                Segment::Special(USER),
                Segment::Text("hi".into()),
                Segment::Special(ASSISTANT),
            ]
        );
        // BOS, <｜User｜>, 1 token of text, <｜Assistant｜>.
        assert_eq!(
            Counter::Estimate.count_chat(&render_chat(&[msg("user", "hi")], None)),
            4
        );
        let mut a = msg("assistant", "");
        a.tool_calls = vec![("f".into(), "{}".into())];
        let s = render_chat(&[msg("user", "x"), a, msg("tool", "42")], None);
        assert!(s.contains(&Segment::Special(TOOL_SEP)));
        assert_eq!(s[s.len() - 2], Segment::Special(TOOL_OUTPUTS_END));
    }

    #[test]
    fn the_test_tokenizer_counts_markers_as_one_token() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/data/tokenizer.json"
        );
        let c = Counter::from_file(Path::new(path)).expect("the test tokenizer loads");
        let plain = c.count_text("the twin predicts each step");
        assert!(plain >= 5, "{plain}");
        let chat = c.count_chat(&render_chat(
            &[msg("user", "the twin predicts each step")],
            None,
        ));
        // BOS + <｜User｜> + the text (no BOS of its own here) + <｜Assistant｜>.
        let text_only = c.count_chat(&[Segment::Text("the twin predicts each step".into())]);
        assert_eq!(chat, text_only + 3);
        assert!(c.vocab_size().unwrap() > 100);
        assert!(Counter::from_file(Path::new("/nonexistent/tokenizer.json")).is_err());
    }
}
