//! DeepSeek output parsers, as vLLM's `--tool-call-parser` and `--reasoning-parser` name them:
//! they split a model's raw text into reasoning, content and tool calls, both incrementally
//! (one text delta at a time, for streams) and for a whole answer.
//!
//! - Reasoning (`deepseek_r1`): everything up to `</think>` is reasoning (the R1 chat template
//!   opens `<think>` in the prompt, so the output usually lacks it; a leading one is dropped).
//!   `deepseek_v3`: the same when the request asks for thinking
//!   (`chat_template_kwargs.thinking`), otherwise all content. `deepseek_v4`: as `deepseek_v3`,
//!   and a `<｜DSML｜tool_calls>` block inside the reasoning ends it (the block is content).
//! - Tool calls, V3 (`deepseek_v3`):
//!   `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>`;
//!   V3.1 (`deepseek_v31`): `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>` inside
//!   the same outer markers; V3.2 (`deepseek_v32`) and V4 (`deepseek_v4`): DSML blocks,
//!   `<｜DSML｜function_calls>` (V3.2) or `<｜DSML｜tool_calls>` (V4) around
//!   `<｜DSML｜invoke name="NAME">` elements whose `<｜DSML｜parameter name="P" string="true|false">`
//!   children become a JSON object, converted to the request's tool schema as vLLM converts
//!   them (`dsml_arguments`).
//!
//! Markers are matched on text, so the parsers work on any detokenized output; text that could
//! still grow into a marker is held back until it cannot. As in vLLM, content after the tool
//! calls is dropped, a call the output cut off before its end is not reported as a call, and a
//! section in which no call completes is content (V3.1, V3.2, V4). The behaviour is checked
//! against vLLM's own test cases (tests/vllm_parser_cases.rs).

use serde_json::Value;
use std::fmt;

const THINK_START: &str = "<think>";
const THINK_END: &str = "</think>";
const CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
const CALLS_END: &str = "<｜tool▁calls▁end｜>";
const CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const CALL_END: &str = "<｜tool▁call▁end｜>";
const SEP: &str = "<｜tool▁sep｜>";
const V3_ARGS_OPEN: &str = "```json\n";
const V3_ARGS_CLOSE: &str = "\n```";
const DSML_INVOKE: &str = "<｜DSML｜invoke name=\"";
const DSML_INVOKE_END: &str = "</｜DSML｜invoke>";
const DSML_PARAM: &str = "<｜DSML｜parameter name=\"";
const DSML_PARAM_END: &str = "</｜DSML｜parameter>";

/// A `--reasoning-parser` name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReasoningKind {
    /// `deepseek_r1`: reasoning until `</think>`.
    DeepseekR1,
    /// `deepseek_v3`: like R1 when the request enables thinking, else no reasoning.
    DeepseekV3,
    /// `deepseek_v4`: as `deepseek_v3`, and a DSML tool-call block (`<｜DSML｜tool_calls>`) in the
    /// reasoning ends it: the block and what follows are content, for the tool parser.
    DeepseekV4,
}

/// A `--tool-call-parser` name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolKind {
    DeepseekV3,
    DeepseekV31,
    DeepseekV32,
    DeepseekV4,
}

/// A parser name that is not known.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} `{name}`; known: {known}")]
pub struct UnknownParser {
    pub what: &'static str,
    pub name: String,
    pub known: &'static str,
}

impl ReasoningKind {
    pub const NAMES: &'static str = "deepseek_r1, deepseek_v3, deepseek_v4";

    pub fn from_name(name: &str) -> Result<Self, UnknownParser> {
        match name {
            "deepseek_r1" => Ok(Self::DeepseekR1),
            "deepseek_v3" => Ok(Self::DeepseekV3),
            "deepseek_v4" => Ok(Self::DeepseekV4),
            _ => Err(UnknownParser {
                what: "reasoning parser",
                name: name.into(),
                known: Self::NAMES,
            }),
        }
    }
}

impl ToolKind {
    pub const NAMES: &'static str = "deepseek_v3, deepseek_v31, deepseek_v32, deepseek_v4";

    pub fn from_name(name: &str) -> Result<Self, UnknownParser> {
        match name {
            "deepseek_v3" => Ok(Self::DeepseekV3),
            "deepseek_v31" => Ok(Self::DeepseekV31),
            "deepseek_v32" => Ok(Self::DeepseekV32),
            "deepseek_v4" => Ok(Self::DeepseekV4),
            _ => Err(UnknownParser {
                what: "tool call parser",
                name: name.into(),
                known: Self::NAMES,
            }),
        }
    }

    /// The marker that opens the tool-call section.
    fn opening(self) -> &'static str {
        match self {
            Self::DeepseekV3 | Self::DeepseekV31 => CALLS_BEGIN,
            Self::DeepseekV32 => "<｜DSML｜function_calls>",
            Self::DeepseekV4 => "<｜DSML｜tool_calls>",
        }
    }

    /// The marker that closes the tool-call section.
    fn closing(self) -> &'static str {
        match self {
            Self::DeepseekV3 | Self::DeepseekV31 => CALLS_END,
            Self::DeepseekV32 => "</｜DSML｜function_calls>",
            Self::DeepseekV4 => "</｜DSML｜tool_calls>",
        }
    }
}

/// Bytes at the end of `buf` that could be the start of `marker` (held back while streaming).
fn held(buf: &str, marker: &str) -> usize {
    let max = buf.len().min(marker.len().saturating_sub(1));
    (1..=max)
        .rev()
        .find(|&k| buf.is_char_boundary(buf.len() - k) && marker.starts_with(&buf[buf.len() - k..]))
        .unwrap_or(0)
}

/// The reasoning/content split of one choice's output, fed delta by delta.
#[derive(Clone, Debug)]
pub struct ReasoningParser {
    kind: ReasoningKind,
    in_reasoning: bool,
    /// Nothing was read yet (a leading `<think>` is dropped).
    at_start: bool,
    buf: String,
}

impl ReasoningParser {
    /// `thinking`: the request's `chat_template_kwargs.thinking` (or `enable_thinking`).
    pub fn new(kind: ReasoningKind, thinking: bool) -> Self {
        ReasoningParser {
            kind,
            in_reasoning: kind == ReasoningKind::DeepseekR1 || thinking,
            at_start: true,
            buf: String::new(),
        }
    }

    /// Reads `text`; returns (reasoning, content) that can be released now.
    pub fn push(&mut self, text: &str) -> (String, String) {
        if !self.in_reasoning {
            return (String::new(), text.to_string());
        }
        self.buf.push_str(text);
        if self.at_start {
            let t = self.buf.trim_start();
            if t.len() < THINK_START.len() && THINK_START.starts_with(t) {
                return (String::new(), String::new());
            }
            if let Some(rest) = t.strip_prefix(THINK_START) {
                self.buf = rest.to_string();
            }
            self.at_start = false;
        }
        // V4: a tool-call block before `</think>` ends the reasoning, and is content.
        let tool_start = (self.kind == ReasoningKind::DeepseekV4)
            .then(|| self.buf.find(ToolKind::DeepseekV4.opening()))
            .flatten();
        match (self.buf.find(THINK_END), tool_start) {
            (Some(p), t) if t.is_none_or(|t| p < t) => {
                let content = self.buf[p + THINK_END.len()..].to_string();
                self.buf.truncate(p);
                self.in_reasoning = false;
                return (std::mem::take(&mut self.buf), content);
            }
            (_, Some(t)) => {
                let content = self.buf.split_off(t);
                self.in_reasoning = false;
                return (std::mem::take(&mut self.buf), content);
            }
            _ => {}
        }
        let mut keep = held(&self.buf, THINK_END);
        if self.kind == ReasoningKind::DeepseekV4 {
            keep = keep.max(held(&self.buf, ToolKind::DeepseekV4.opening()));
        }
        let rest = self.buf.split_off(self.buf.len() - keep);
        (std::mem::replace(&mut self.buf, rest), String::new())
    }

    /// The output ended: what was held back is reasoning.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.buf)
    }
}

/// A piece of a tool call, as a streamed `tool_calls` delta carries it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCallDelta {
    pub index: u32,
    /// Set on the call's first delta, with the name.
    pub id: Option<String>,
    pub name: Option<String>,
    pub arguments: String,
}

/// A complete tool call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

#[derive(Clone, Debug, PartialEq)]
enum ToolState {
    Content,
    /// Inside the tool-call section, between calls.
    Between,
    /// After a call's opening, before its arguments.
    Header,
    /// Reading a V3/V3.1 call's arguments.
    Args,
    /// Inside a DSML invoke, collecting parameters in the order the model wrote them.
    Invoke(Vec<Param>),
    /// After the section: the rest is dropped.
    Done,
}

/// A DSML parameter as the model wrote it: its name, its `string` attribute, its text.
#[derive(Clone, Debug, PartialEq)]
struct Param {
    name: String,
    string: bool,
    text: String,
}

/// Tool-call extraction from one choice's output, fed delta by delta.
#[derive(Clone, Debug)]
pub struct ToolParser {
    kind: ToolKind,
    id_prefix: String,
    state: ToolState,
    buf: String,
    calls: Vec<ToolCall>,
    /// Whether each call's end was seen.
    complete: Vec<bool>,
    /// The request's tools: each one's name and JSON-schema `parameters` (DSML arguments are
    /// converted to them).
    tools: Vec<(String, Value)>,
    /// The raw text from the tool-call section's opening marker on: the content, as vLLM
    /// returns it, of a section in which no call completes (V3.1, V3.2, V4).
    section: Option<String>,
    /// In a V4 invoke of a declared tool that came without the opening block (vLLM recovers
    /// it as a call; what follows the block is content again).
    orphan: bool,
    /// Inside V3.2's wrapper (`<｜DSML｜function_calls>`) in V4's content: its invokes are that
    /// format's, content to V4.
    foreign: bool,
}

/// What a delta of output turned into.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolOutput {
    pub content: String,
    pub calls: Vec<ToolCallDelta>,
}

impl ToolParser {
    /// Call ids are `{id_prefix}-{index}`.
    pub fn new(kind: ToolKind, id_prefix: &str) -> Self {
        Self::with_tools(kind, id_prefix, None)
    }

    /// [`ToolParser::new`] for a request with `tools` (its OpenAI `tools` array): DSML
    /// arguments are converted to each tool's parameter schema, as vLLM does.
    pub fn with_tools(kind: ToolKind, id_prefix: &str, tools: Option<&Value>) -> Self {
        let tools = tools
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|t| {
                let f = t.get("function")?;
                let name = f.get("name")?.as_str()?.to_string();
                Some((name, f.get("parameters").cloned().unwrap_or(Value::Null)))
            })
            .collect();
        ToolParser {
            kind,
            id_prefix: id_prefix.to_string(),
            state: ToolState::Content,
            buf: String::new(),
            calls: Vec::new(),
            complete: Vec::new(),
            tools,
            section: None,
            orphan: false,
            foreign: false,
        }
    }

    /// Reads `text`; returns the content and tool-call pieces that can be released now.
    pub fn push(&mut self, text: &str) -> ToolOutput {
        // The raw section matters only while no call has completed.
        if self.has_complete_call() {
            self.section = None;
        }
        if let Some(s) = &mut self.section {
            s.push_str(text);
        }
        self.buf.push_str(text);
        let mut out = ToolOutput::default();
        while self.step(&mut out) {}
        out
    }

    /// The output ended: held-back content is released; an unfinished call stays unfinished.
    /// A section in which no call completed is content, raw, as vLLM returns it (V3.1 and the
    /// DSML formats; V3 drops it).
    pub fn finish(&mut self) -> ToolOutput {
        let mut out = ToolOutput::default();
        if self.state == ToolState::Content {
            out.content = std::mem::take(&mut self.buf);
        } else if self.kind != ToolKind::DeepseekV3 && !self.has_complete_call() {
            out.content = self.section.take().unwrap_or_default();
        }
        out
    }

    /// Whether any call's end was seen.
    pub fn has_complete_call(&self) -> bool {
        self.complete.contains(&true)
    }

    /// Calls whose end was seen.
    pub fn complete_calls(&self) -> Vec<ToolCall> {
        self.calls
            .iter()
            .zip(&self.complete)
            .filter(|(_, &c)| c)
            .map(|(c, _)| c.clone())
            .collect()
    }

    /// Releases the first `n` bytes of the buffer as content.
    fn release(&mut self, n: usize, out: &mut ToolOutput) {
        out.content.extend(self.buf.drain(..n));
    }

    fn start_call(&mut self, name: &str, out: &mut ToolOutput) {
        let index = self.calls.len() as u32;
        let id = format!("{}-{index}", self.id_prefix);
        self.calls.push(ToolCall {
            id: id.clone(),
            name: name.to_string(),
            arguments: String::new(),
        });
        self.complete.push(false);
        out.calls.push(ToolCallDelta {
            index,
            id: Some(id),
            name: Some(name.to_string()),
            arguments: String::new(),
        });
    }

    fn args(&mut self, text: &str, out: &mut ToolOutput) {
        if text.is_empty() {
            return;
        }
        let index = self.calls.len() as u32 - 1;
        self.calls
            .last_mut()
            .expect("a call")
            .arguments
            .push_str(text);
        match out.calls.last_mut() {
            Some(d) if d.index == index => d.arguments.push_str(text),
            _ => out.calls.push(ToolCallDelta {
                index,
                id: None,
                name: None,
                arguments: text.to_string(),
            }),
        }
    }

    /// Consumes what the buffer allows in the current state; false when it needs more text.
    fn step(&mut self, out: &mut ToolOutput) -> bool {
        match std::mem::replace(&mut self.state, ToolState::Done) {
            ToolState::Content => {
                let open = self.kind.opening();
                // V4 with tools: an invoke without the opening block is a call of a declared
                // tool, as vLLM recovers it (but not inside V3.2's wrapper). The markers are
                // taken in the order they come.
                let orphans = self.kind == ToolKind::DeepseekV4 && !self.tools.is_empty();
                if orphans {
                    let (f_open, f_close) = (
                        ToolKind::DeepseekV32.opening(),
                        ToolKind::DeepseekV32.closing(),
                    );
                    let foreign = if self.foreign { f_close } else { f_open };
                    let at = |m: &str| self.buf.find(m);
                    let first = [(at(open), 0), (at(DSML_INVOKE), 1), (at(foreign), 2)]
                        .into_iter()
                        .filter_map(|(p, k)| p.map(|p| (p, k)))
                        .min();
                    match first {
                        Some((p, 2)) => {
                            self.release(p + foreign.len(), out);
                            self.foreign = !self.foreign;
                            self.state = ToolState::Content;
                            return true;
                        }
                        Some((q, 1)) if self.foreign => {
                            self.release(q + DSML_INVOKE.len(), out);
                            self.state = ToolState::Content;
                            return true;
                        }
                        Some((q, 1)) => {
                            let after = &self.buf[q + DSML_INVOKE.len()..];
                            let end = after.find('"');
                            let declared = end
                                .is_some_and(|e| self.tools.iter().any(|(n, _)| *n == after[..e]));
                            let name_may_come =
                                end.is_none() && after.len() < 256 && !after.contains(['<', '\n']);
                            self.release(q, out);
                            self.state = ToolState::Content;
                            if declared {
                                self.section = Some(self.buf.clone());
                                self.buf.drain(..DSML_INVOKE.len());
                                self.orphan = true;
                                self.state = ToolState::Header;
                                return true;
                            }
                            if name_may_come {
                                return false;
                            }
                            // Not a call: the marker is content.
                            self.release(DSML_INVOKE.len(), out);
                            return true;
                        }
                        Some(_) => {}
                        None => {
                            let keep = [open, DSML_INVOKE, foreign]
                                .iter()
                                .map(|m| held(&self.buf, m))
                                .max()
                                .unwrap_or(0);
                            self.release(self.buf.len() - keep, out);
                            self.state = ToolState::Content;
                            return false;
                        }
                    }
                }
                if let Some(p) = self.buf.find(open) {
                    out.content.push_str(&self.buf[..p]);
                    self.section = Some(self.buf[p..].to_string());
                    self.buf.drain(..p + open.len());
                    self.state = ToolState::Between;
                    return true;
                }
                let keep = held(&self.buf, open);
                self.release(self.buf.len() - keep, out);
                self.state = ToolState::Content;
                false
            }
            ToolState::Between => {
                let t = self.buf.trim_start();
                let (open, close) = match self.kind {
                    ToolKind::DeepseekV3 | ToolKind::DeepseekV31 => {
                        (CALL_BEGIN, self.kind.closing())
                    }
                    ToolKind::DeepseekV32 | ToolKind::DeepseekV4 => {
                        (DSML_INVOKE, self.kind.closing())
                    }
                };
                if let Some(rest) = t.strip_prefix(open) {
                    self.buf = rest.to_string();
                    self.state = ToolState::Header;
                    return true;
                }
                if self.orphan {
                    // After a recovered invoke (and its stray closing marker): content again.
                    if let Some(rest) = t.strip_prefix(close) {
                        self.buf = rest.to_string();
                        self.orphan = false;
                        self.state = ToolState::Content;
                        return true;
                    }
                    if !(open.starts_with(t) || close.starts_with(t)) {
                        self.orphan = false;
                        self.state = ToolState::Content;
                        return true;
                    }
                }
                if t.starts_with(close) {
                    self.buf.clear();
                    self.state = ToolState::Done;
                    return false;
                }
                if open.starts_with(t) || close.starts_with(t) {
                    self.state = ToolState::Between;
                    return false;
                }
                // Not the format: like vLLM, the section ends here.
                self.buf.clear();
                self.state = ToolState::Done;
                false
            }
            ToolState::Header => self.header(out),
            ToolState::Args => {
                let close = match self.kind {
                    ToolKind::DeepseekV3 => V3_ARGS_CLOSE,
                    _ => CALL_END,
                };
                if let Some(p) = self.buf.find(CALL_END) {
                    let mut a = self.buf[..p].to_string();
                    if self.kind == ToolKind::DeepseekV3 {
                        let t = a.trim_end();
                        a.truncate(t.strip_suffix("```").unwrap_or(t).trim_end().len());
                    }
                    self.args(&a, out);
                    *self.complete.last_mut().expect("a call") = true;
                    self.buf.drain(..p + CALL_END.len());
                    self.state = ToolState::Between;
                    return true;
                }
                let keep = if self.kind == ToolKind::DeepseekV3 {
                    // Everything from a trailing newline on could be the closing fence.
                    let fence = format!("{close}{CALL_END}");
                    held(&self.buf, &fence).max(held(&self.buf, CALL_END))
                } else {
                    held(&self.buf, CALL_END)
                };
                let rest = self.buf.split_off(self.buf.len() - keep);
                let a = std::mem::replace(&mut self.buf, rest);
                self.args(&a, out);
                self.state = ToolState::Args;
                false
            }
            ToolState::Invoke(params) => self.invoke(params, out),
            ToolState::Done => {
                self.buf.clear();
                false
            }
        }
    }

    fn header(&mut self, out: &mut ToolOutput) -> bool {
        match self.kind {
            ToolKind::DeepseekV31 => {
                let Some(p) = self.buf.find(SEP) else {
                    self.state = ToolState::Header;
                    return false;
                };
                let name = self.buf[..p].trim().to_string();
                self.buf.drain(..p + SEP.len());
                self.start_call(&name, out);
                self.state = ToolState::Args;
                true
            }
            ToolKind::DeepseekV3 => {
                // TYPE<sep>NAME\n```json\n
                let Some(p) = self.buf.find(SEP) else {
                    self.state = ToolState::Header;
                    return false;
                };
                let after = &self.buf[p + SEP.len()..];
                let Some(nl) = after.find('\n') else {
                    self.state = ToolState::Header;
                    return false;
                };
                let rest = &after[nl + 1..];
                if rest.len() < V3_ARGS_OPEN.len() && V3_ARGS_OPEN.starts_with(rest) {
                    self.state = ToolState::Header;
                    return false;
                }
                let name = after[..nl].trim().to_string();
                let rest = rest.strip_prefix(V3_ARGS_OPEN).unwrap_or(rest).to_string();
                self.buf = rest;
                self.start_call(&name, out);
                self.state = ToolState::Args;
                true
            }
            ToolKind::DeepseekV32 | ToolKind::DeepseekV4 => {
                // NAME">
                let Some(p) = self.buf.find('>') else {
                    self.state = ToolState::Header;
                    return false;
                };
                let name = self.buf[..p].trim().trim_end_matches('"').to_string();
                self.buf.drain(..p + 1);
                self.start_call(&name, out);
                self.state = ToolState::Invoke(Vec::new());
                true
            }
        }
    }

    fn invoke(&mut self, mut params: Vec<Param>, out: &mut ToolOutput) -> bool {
        let t = self.buf.trim_start();
        if let Some(rest) = t.strip_prefix(DSML_INVOKE_END) {
            let name = &self.calls.last().expect("a call").name;
            let schema = self.tools.iter().find(|(n, _)| n == name).map(|(_, s)| s);
            let args = dsml_arguments(self.kind, &params, schema);
            self.buf = rest.to_string();
            self.args(&args, out);
            *self.complete.last_mut().expect("a call") = true;
            self.state = ToolState::Between;
            return true;
        }
        if let Some(rest) = t.strip_prefix(DSML_PARAM) {
            let Some(end) = rest.find(DSML_PARAM_END) else {
                self.state = ToolState::Invoke(params);
                return false;
            };
            let element = &rest[..end];
            // NAME" string="true|false">VALUE
            let (head, value) = element.split_once('>').unwrap_or((element, ""));
            let name = head.split('"').next().unwrap_or("").to_string();
            let string = !head.contains("string=\"false\"");
            // A name given twice: the last one wins, at its place.
            params.retain(|p| p.name != name);
            params.push(Param {
                name,
                string,
                text: value.to_string(),
            });
            self.buf = rest[end + DSML_PARAM_END.len()..].to_string();
            self.state = ToolState::Invoke(params);
            return true;
        }
        if DSML_INVOKE_END.starts_with(t) || DSML_PARAM.starts_with(t) {
            self.state = ToolState::Invoke(params);
            return false;
        }
        // Not the format: the section ends here, the call unfinished.
        self.buf.clear();
        self.state = ToolState::Done;
        false
    }
}

/// A DSML invoke's arguments as vLLM converts them: `string="true"` text stays a string (V4;
/// V3.2 also converts it where the tool's schema types the parameter), other text is converted
/// to the parameter's schema types ([`coerce`]); where the schema does not name the parameter,
/// V3.2 parses it as JSON and V4 keeps it as text; then a lone undeclared `arguments` or `input` parameter holding an object
/// of declared parameters is unwrapped (vLLM's `_repair_param_dict`).
fn dsml_arguments(kind: ToolKind, params: &[Param], schema: Option<&Value>) -> String {
    let props = schema
        .and_then(|s| s.get("properties"))
        .and_then(Value::as_object);
    // In the order the model wrote them (the last of a repeated name at its place).
    let mut args: Vec<(String, Value)> = Vec::new();
    for p in params {
        let typed = props.and_then(|m| m.get(&p.name));
        let v = match (p.string, typed) {
            (true, Some(t)) if kind == ToolKind::DeepseekV32 => coerce(&p.text, &schema_types(t)),
            (true, _) => Value::String(p.text.clone()),
            (false, Some(t)) => coerce(&p.text, &schema_types(t)),
            // Untyped: V3.2 reads JSON; V4 keeps the text, as its schema types default to string.
            (false, None) if kind == ToolKind::DeepseekV32 => json_or_string(&p.text),
            (false, None) => Value::String(p.text.clone()),
        };
        args.push((p.name.clone(), v));
    }
    let declared = |k: &str| props.is_some_and(|m| m.contains_key(k));
    if let [(wrapper, inner)] = args.as_slice() {
        if ["arguments", "input"].contains(&wrapper.as_str()) && !declared(wrapper) {
            let inner = match inner {
                Value::String(s) => serde_json::from_str::<Value>(s).unwrap_or(Value::Null),
                v => v.clone(),
            };
            if let Value::Object(o) = &inner {
                if o.keys().all(|k| declared(k)) {
                    return inner.to_string();
                }
            }
        }
    }
    let fields: Vec<String> = args
        .iter()
        .map(|(k, v)| format!("{}:{v}", Value::String(k.clone())))
        .collect();
    format!("{{{}}}", fields.join(","))
}

/// JSON when `text` is JSON, else the text as a string.
fn json_or_string(text: &str) -> Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|_| Value::String(text.to_string()))
}

/// The JSON types a parameter's schema allows: its `type` (one or a list), the types of its
/// `enum` values, and those of its `anyOf`/`oneOf`/`allOf` branches; `string` when it names
/// none (vLLM's `extract_types_from_schema`, with its aliases).
fn schema_types(schema: &Value) -> Vec<&'static str> {
    fn walk(s: &Value, out: &mut Vec<&'static str>) {
        let name = |t: &str| -> Option<&'static str> {
            Some(match t.to_ascii_lowercase().as_str() {
                "null" | "none" => "null",
                "integer" | "int" | "int32" | "int64" | "long" => "integer",
                "number" | "float" | "double" | "decimal" => "number",
                "boolean" | "bool" => "boolean",
                "object" | "dict" | "map" => "object",
                "array" | "list" | "arr" | "tuple" => "array",
                "string" | "str" | "text" => "string",
                _ => return None,
            })
        };
        match s.get("type") {
            Some(Value::String(t)) => out.extend(name(t)),
            Some(Value::Array(ts)) => {
                out.extend(ts.iter().filter_map(Value::as_str).filter_map(name))
            }
            _ => {}
        }
        for e in s
            .get("enum")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            out.push(match e {
                Value::Null => "null",
                Value::Bool(_) => "boolean",
                Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
                Value::Number(_) => "number",
                Value::String(_) => "string",
                Value::Array(_) => "array",
                Value::Object(_) => "object",
            });
        }
        for k in ["anyOf", "oneOf", "allOf"] {
            for b in s.get(k).and_then(Value::as_array).into_iter().flatten() {
                walk(b, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(schema, &mut out);
    if out.is_empty() {
        out.push("string");
    }
    out
}

/// `text` as the first of the allowed `types` it reads as, in vLLM's order (null, integer,
/// number, boolean, object, array, string); failing all, JSON or the text itself.
fn coerce(text: &str, types: &[&str]) -> Value {
    let has = |t: &str| types.contains(&t);
    let t = text.trim();
    if has("null") && t.eq_ignore_ascii_case("null") {
        return Value::Null;
    }
    if has("integer") {
        if let Ok(i) = t.parse::<i64>() {
            return i.into();
        }
    }
    if has("number") {
        if let Some(f) = t.parse::<f64>().ok().filter(|f| f.is_finite()) {
            // A whole number reads as an integer, as vLLM returns `int(val)` for it.
            return if f.fract() == 0.0 && f.abs() < 9.0e15 {
                (f as i64).into()
            } else {
                f.into()
            };
        }
    }
    if has("boolean") {
        match t.to_ascii_lowercase().as_str() {
            "true" | "1" => return true.into(),
            "false" | "0" => return false.into(),
            _ => {}
        }
    }
    if has("object") || has("array") {
        if let Ok(v) = serde_json::from_str::<Value>(text) {
            return v;
        }
    }
    if has("string") {
        return Value::String(text.to_string());
    }
    json_or_string(text)
}

impl fmt::Display for ToolKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::DeepseekV3 => "deepseek_v3",
            Self::DeepseekV31 => "deepseek_v31",
            Self::DeepseekV32 => "deepseek_v32",
            Self::DeepseekV4 => "deepseek_v4",
        })
    }
}

/// A whole answer split: (reasoning, content, complete tool calls). Empty parts are `None`.
pub fn parse_whole(
    text: &str,
    reasoning: Option<(ReasoningKind, bool)>,
    tools: Option<(ToolKind, &str)>,
) -> (Option<String>, Option<String>, Vec<ToolCall>) {
    parse_whole_with(text, reasoning, tools.map(|(k, id)| (k, id, None)))
}

/// [`parse_whole`] for a request with tools (its OpenAI `tools` array; see
/// [`ToolParser::with_tools`]).
pub fn parse_whole_with(
    text: &str,
    reasoning: Option<(ReasoningKind, bool)>,
    tools: Option<(ToolKind, &str, Option<&Value>)>,
) -> (Option<String>, Option<String>, Vec<ToolCall>) {
    let (mut r, mut c) = match reasoning {
        Some((k, thinking)) => {
            let mut p = ReasoningParser::new(k, thinking);
            let (mut r, c) = p.push(text);
            r.push_str(&p.finish());
            (r, c)
        }
        None => (String::new(), text.to_string()),
    };
    let mut calls = Vec::new();
    if let Some((k, id, specs)) = tools {
        let mut p = ToolParser::with_tools(k, id, specs);
        let mut o = p.push(&c);
        o.content.push_str(&p.finish().content);
        c = o.content;
        calls = p.complete_calls();
    }
    let some = |s: &mut String| (!s.is_empty()).then(|| std::mem::take(s));
    (some(&mut r), some(&mut c), calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `text` in pieces of `step` characters; returns (content, calls by index).
    fn stream(kind: ToolKind, text: &str, step: usize) -> (String, Vec<(String, String)>) {
        let mut p = ToolParser::new(kind, "call");
        let chars: Vec<char> = text.chars().collect();
        let mut content = String::new();
        let mut calls: Vec<(String, String)> = Vec::new();
        let mut take = |o: ToolOutput| {
            content.push_str(&o.content);
            for d in o.calls {
                if let Some(n) = d.name {
                    assert_eq!(
                        d.index as usize,
                        calls.len(),
                        "a new call has the next index"
                    );
                    calls.push((n, String::new()));
                }
                calls[d.index as usize].1.push_str(&d.arguments);
            }
        };
        for piece in chars.chunks(step) {
            take(p.push(&piece.iter().collect::<String>()));
        }
        take(p.finish());
        (content, calls)
    }

    fn all_steps(kind: ToolKind, text: &str, content: &str, calls: &[(&str, &str)]) {
        for step in [1, 2, 3, 7, 1000] {
            let (c, k) = stream(kind, text, step);
            assert_eq!(c, content, "content, step {step}");
            let k: Vec<(&str, &str)> = k.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
            assert_eq!(k, calls, "calls, step {step}");
        }
        let (_, c, whole) = parse_whole(text, None, Some((kind, "call")));
        assert_eq!(c.unwrap_or_default(), content);
        let whole: Vec<(&str, &str)> = whole
            .iter()
            .map(|c| (c.name.as_str(), c.arguments.as_str()))
            .collect();
        assert_eq!(whole, calls);
    }

    #[test]
    fn v31_tool_calls() {
        let text = "Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"location\": \"杭州\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        all_steps(
            ToolKind::DeepseekV31,
            text,
            "Let me check.",
            &[
                ("get_weather", "{\"location\": \"杭州\"}"),
                ("get_time", "{}"),
            ],
        );
    }

    #[test]
    fn v3_tool_calls_in_json_fences() {
        let text = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_current_weather\n```json\n{\"location\": \"Beijing\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>lookup\n```json\n{\"q\": \"a`b\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        all_steps(
            ToolKind::DeepseekV3,
            text,
            "",
            &[
                ("get_current_weather", "{\"location\": \"Beijing\"}"),
                ("lookup", "{\"q\": \"a`b\"}"),
            ],
        );
    }

    #[test]
    fn dsml_tool_calls_v4_and_v32() {
        let body = "\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"location\" string=\"true\">杭州</｜DSML｜parameter>\n<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"now\">\n</｜DSML｜invoke>\n";
        let v4 = format!("Sure.\n\n<｜DSML｜tool_calls>{body}</｜DSML｜tool_calls>");
        // Without the request's tools, V4 keeps an untyped `string="false"` value as text and
        // V3.2 reads it as JSON (vLLM's two parsers).
        let v4_calls = [
            ("get_weather", "{\"location\":\"杭州\",\"days\":\"3\"}"),
            ("now", "{}"),
        ];
        all_steps(ToolKind::DeepseekV4, &v4, "Sure.\n\n", &v4_calls);
        let calls = [
            ("get_weather", "{\"location\":\"杭州\",\"days\":3}"),
            ("now", "{}"),
        ];
        let v32 = format!("<｜DSML｜function_calls>{body}</｜DSML｜function_calls>");
        all_steps(ToolKind::DeepseekV32, &v32, "", &calls);
        // With them, the schema types it.
        let tools = serde_json::json!([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"location": {"type": "string"},
            "days": {"type": "integer"}}}}}]);
        let (_, _, typed) =
            parse_whole_with(&v4, None, Some((ToolKind::DeepseekV4, "c", Some(&tools))));
        assert_eq!(typed[0].arguments, "{\"location\":\"杭州\",\"days\":3}");
        // Each format's marker is plain text to the other parser.
        all_steps(ToolKind::DeepseekV32, &v4, &v4, &[]);
    }

    /// V4 with the request's tools: invokes inside V3.2's wrapper stay content, however many, and
    /// an invoke of a declared tool after that wrapper is a call, whole and streamed alike.
    #[test]
    fn v4_orphan_invokes_and_v32_wrappers_whole_and_streamed() {
        let tools = serde_json::json!([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
        let inv = "<｜DSML｜invoke name=\"get_weather\"><｜DSML｜parameter name=\"city\" string=\"true\">Oslo</｜DSML｜parameter></｜DSML｜invoke>";
        let wrapped = format!("<｜DSML｜function_calls>\n{inv}\n{inv}\n</｜DSML｜function_calls>");
        let then_orphan = format!("{wrapped} then {inv} after");
        for (text, content, calls) in [
            (wrapped.clone(), wrapped.clone(), 0),
            (then_orphan.clone(), format!("{wrapped} then  after"), 1),
        ] {
            let (_, c, k) =
                parse_whole_with(&text, None, Some((ToolKind::DeepseekV4, "c", Some(&tools))));
            assert_eq!(
                (c.as_deref(), k.len()),
                (Some(content.as_str()), calls),
                "{text}"
            );
            for step in [1, 2, 3, 7] {
                let mut p = ToolParser::with_tools(ToolKind::DeepseekV4, "c", Some(&tools));
                let chars: Vec<char> = text.chars().collect();
                let mut got = String::new();
                for piece in chars.chunks(step) {
                    got.push_str(&p.push(&piece.iter().collect::<String>()).content);
                }
                got.push_str(&p.finish().content);
                assert_eq!(
                    (got.as_str(), p.complete_calls().len()),
                    (content.as_str(), calls),
                    "step {step}"
                );
            }
        }
    }

    #[test]
    fn text_without_calls_is_content_even_when_it_looks_like_a_marker() {
        let t = "the twin predicts <｜tool and <think> each step";
        for k in [
            ToolKind::DeepseekV3,
            ToolKind::DeepseekV31,
            ToolKind::DeepseekV4,
        ] {
            all_steps(k, t, t, &[]);
        }
    }

    #[test]
    fn a_call_cut_off_is_not_a_call_and_its_text_is_content() {
        // As vLLM: V3.1 returns the whole text as content, V3 drops the section.
        let t = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\":";
        let (_, c, calls) = parse_whole(t, None, Some((ToolKind::DeepseekV31, "x")));
        assert_eq!((c.as_deref(), calls), (Some(t), vec![]));
        // A stream has sent the call's first pieces by then; its end adds the text.
        let (c, _) = stream(ToolKind::DeepseekV31, t, 3);
        assert_eq!(c, t);
        let t = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{";
        let (_, c, calls) = parse_whole(t, None, Some((ToolKind::DeepseekV3, "x")));
        assert_eq!((c, calls), (None, vec![]));
    }

    #[test]
    fn reasoning_r1_and_v3() {
        let t = "<think>\nfirst, the fabric</think>\n\nThe answer.";
        for step in [1, 2, 5, 100] {
            let mut p = ReasoningParser::new(ReasoningKind::DeepseekR1, false);
            let (mut r, mut c) = (String::new(), String::new());
            let chars: Vec<char> = t.chars().collect();
            for piece in chars.chunks(step) {
                let (a, b) = p.push(&piece.iter().collect::<String>());
                r.push_str(&a);
                c.push_str(&b);
            }
            r.push_str(&p.finish());
            assert_eq!(
                (r.as_str(), c.as_str()),
                ("\nfirst, the fabric", "\n\nThe answer.")
            );
        }
        // R1's template opens <think> in the prompt: the output starts inside it.
        let (r, c, _) = parse_whole(
            "plan</think>done",
            Some((ReasoningKind::DeepseekR1, false)),
            None,
        );
        assert_eq!((r.as_deref(), c.as_deref()), (Some("plan"), Some("done")));
        // No end tag: all reasoning, as vLLM.
        let (r, c, _) = parse_whole(
            "still thinking",
            Some((ReasoningKind::DeepseekR1, false)),
            None,
        );
        assert_eq!((r.as_deref(), c), (Some("still thinking"), None));
        // V3 without thinking: all content; with thinking: like R1.
        let (r, c, _) = parse_whole("a</think>b", Some((ReasoningKind::DeepseekV3, false)), None);
        assert_eq!((r, c.as_deref()), (None, Some("a</think>b")));
        let (r, c, _) = parse_whole("a</think>b", Some((ReasoningKind::DeepseekV3, true)), None);
        assert_eq!((r.as_deref(), c.as_deref()), (Some("a"), Some("b")));
    }

    #[test]
    fn reasoning_then_tool_calls() {
        let t = "weather needed</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>w<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        let (r, c, calls) = parse_whole(
            t,
            Some((ReasoningKind::DeepseekR1, false)),
            Some((ToolKind::DeepseekV31, "id")),
        );
        assert_eq!(r.as_deref(), Some("weather needed"));
        assert_eq!(c.as_deref(), Some("\n\n"));
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].id, "id-0");
    }

    #[test]
    fn names() {
        assert_eq!(
            ToolKind::from_name("deepseek_v31"),
            Ok(ToolKind::DeepseekV31)
        );
        assert!(ToolKind::from_name("hermes").is_err());
        assert_eq!(
            ReasoningKind::from_name("deepseek_r1"),
            Ok(ReasoningKind::DeepseekR1)
        );
        assert_eq!(ToolKind::DeepseekV4.to_string(), "deepseek_v4");
    }
}
