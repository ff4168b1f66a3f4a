//! One choice of a request as its output is produced: the text so far (decoded from the token
//! ids when the device returns ids and there is a tokenizer, placeholder words otherwise), what
//! was sent, stop strings (text that could still become one is held back), and the chat parsers
//! (reasoning first, then tool calls in what is not reasoning).

use crate::parsers::{ReasoningParser, ToolCallDelta, ToolParser};
use crate::text;
use dstwin_core::device::ReqId;

/// What a piece of a chat choice's output became after the parsers.
#[derive(Default)]
pub(crate) struct Piece {
    pub reasoning: String,
    pub content: String,
    pub calls: Vec<ToolCallDelta>,
}

impl Piece {
    pub fn is_empty(&self) -> bool {
        self.reasoning.is_empty() && self.content.is_empty() && self.calls.is_empty()
    }
}

/// A chat choice's parsers: reasoning first, then tool calls in what is not reasoning.
pub(crate) struct OutputParser {
    pub reasoning: Option<ReasoningParser>,
    pub tools: Option<ToolParser>,
    pub saw_call: bool,
}

impl OutputParser {
    fn tools_piece(&mut self, reasoning: String, content: String, finish: bool) -> Piece {
        let Some(t) = self.tools.as_mut() else {
            return Piece {
                reasoning,
                content,
                calls: Vec::new(),
            };
        };
        let mut o = t.push(&content);
        if finish {
            let f = t.finish();
            o.content.push_str(&f.content);
            o.calls.extend(f.calls);
        }
        // A call counts once its end was seen (one cut off is content, as vLLM returns it).
        self.saw_call |= t.has_complete_call();
        Piece {
            reasoning,
            content: o.content,
            calls: o.calls,
        }
    }

    /// Reads raw output; `finish`: it is the last, release everything held back.
    pub fn push(&mut self, raw: &str, finish: bool) -> Piece {
        let (mut r, c) = match self.reasoning.as_mut() {
            Some(p) => p.push(raw),
            None => (String::new(), raw.to_string()),
        };
        if finish {
            if let Some(p) = self.reasoning.as_mut() {
                r.push_str(&p.finish());
            }
        }
        self.tools_piece(r, c, finish)
    }
}

/// One choice's output as it is produced: text so far, what was sent, and stop handling.
pub(crate) struct Choice {
    pub index: u32,
    /// Its request in the runtime.
    pub id: ReqId,
    pub seed: u64,
    pub tokens: u32,
    pub text: String,
    pub sent: usize,
    pub finish: Option<&'static str>,
    /// The stop string that ended it (vLLM's `stop_reason`; `None` for an end-of-sequence
    /// token or the length limit).
    pub stop_reason: Option<String>,
    pub parser: Option<OutputParser>,
    /// Decodes real token ids (a device that returns them, a server with a tokenizer).
    pub detok: Option<Detok>,
}

/// Incremental detokenization: every id so far, decoded whole; a trailing incomplete UTF-8
/// sequence (decoded as U+FFFD) waits for the bytes that complete it.
pub(crate) struct Detok {
    pub tokenizer: std::sync::Arc<tokenizers::Tokenizer>,
    pub ids: Vec<u32>,
}

impl Detok {
    pub fn new(tokenizer: std::sync::Arc<tokenizers::Tokenizer>) -> Self {
        Detok {
            tokenizer,
            ids: Vec::new(),
        }
    }

    /// The text of every id so far (special tokens skipped, as vLLM's default).
    fn text(&self, finished: bool) -> String {
        let t = self.tokenizer.decode(&self.ids, true).unwrap_or_default();
        if finished {
            t
        } else {
            t.trim_end_matches('\u{FFFD}').to_string()
        }
    }
}

impl Choice {
    /// Appends `n` tokens; returns the text that may be sent now (held back while it could
    /// still turn into a stop string).
    pub fn push(&mut self, n: u32, ids: &[u32], stops: &[String]) -> String {
        match &mut self.detok {
            Some(d) if !ids.is_empty() => {
                d.ids.extend_from_slice(ids);
                let t = d.text(false);
                self.continue_with(t);
            }
            _ => text::push_tokens(&mut self.text, self.seed, self.tokens, n),
        }
        self.tokens += n;
        let from = self
            .sent
            .saturating_sub(stops.iter().map(String::len).max().unwrap_or(0));
        let from = (0..=from)
            .rev()
            .find(|&i| self.text.is_char_boundary(i))
            .unwrap_or(0);
        // The earliest match (the first listed among those at the same place).
        if let Some((p, s)) = stops
            .iter()
            .filter_map(|s| self.text[from..].find(s.as_str()).map(|p| (p + from, s)))
            .min_by_key(|&(p, _)| p)
        {
            self.text.truncate(p);
            self.finish = Some("stop");
            self.stop_reason = Some(s.clone());
            return self.take(p.max(self.sent));
        }
        let hold = stops
            .iter()
            .map(|s| s.len().saturating_sub(1))
            .max()
            .unwrap_or(0);
        let mut upto = self.text.len().saturating_sub(hold).max(self.sent);
        while !self.text.is_char_boundary(upto) {
            upto -= 1;
        }
        self.take(upto.max(self.sent))
    }

    /// The request ended: the text gets its last bytes, even an incomplete character (decoded
    /// as U+FFFD, as vLLM does).
    pub fn end(&mut self) {
        if let Some(t) = self
            .detok
            .as_ref()
            .filter(|d| !d.ids.is_empty())
            .map(|d| d.text(true))
        {
            self.continue_with(t);
        }
    }

    /// Takes newly decoded text `t`. What was sent stays: `t` continues it (byte-level decoding
    /// is prefix-stable once incomplete characters are held back); where it would not, what
    /// follows the sent bytes is appended.
    fn continue_with(&mut self, t: String) {
        if !t.starts_with(&self.text[..self.sent]) {
            let rest = t.get(self.sent..).unwrap_or("").to_string();
            self.text.truncate(self.sent);
            self.text.push_str(&rest);
        } else {
            self.text = t;
        }
    }

    pub fn take(&mut self, upto: usize) -> String {
        let upto = upto.min(self.text.len());
        if upto <= self.sent {
            return String::new();
        }
        let s = self.text[self.sent..upto].to_string();
        self.sent = upto;
        s
    }

    /// The finish reason as the client sees it: tool calls override the stop reason.
    pub fn reported_finish(&self) -> Option<&'static str> {
        self.finish.map(|f| {
            if self.parser.as_ref().is_some_and(|p| p.saw_call) {
                "tool_calls"
            } else {
                f
            }
        })
    }
}
