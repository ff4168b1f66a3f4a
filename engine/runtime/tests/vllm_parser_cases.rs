//! vLLM's own test cases for its DeepSeek tool-call and reasoning parsers
//! (tests/data/vllm-parser-cases.json: each case's input and expected result, transcribed from
//! vLLM's tests and, where a test asserts less, from its parser's rules; the file's `origin`
//! names the files and commits), run whole and streamed in pieces of 1, 3 and 7 characters.

use dstwin_runtime::parsers::{
    parse_whole_with, ReasoningKind, ReasoningParser, ToolCall, ToolKind, ToolParser,
};
use serde_json::Value;

fn cases() -> Vec<Value> {
    let v: Value =
        serde_json::from_str(include_str!("data/vllm-parser-cases.json")).expect("fixture");
    v["cases"].as_array().expect("cases").clone()
}

/// (reasoning, content, calls as (name, arguments as JSON)) of one way of parsing.
type Parsed = (Option<String>, Option<String>, Vec<(String, Value)>);

fn calls_json(calls: &[ToolCall]) -> Vec<(String, Value)> {
    calls
        .iter()
        .map(|c| {
            let a =
                serde_json::from_str(&c.arguments).unwrap_or(Value::String(c.arguments.clone()));
            (c.name.clone(), a)
        })
        .collect()
}

fn some(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

/// The case fed in pieces of `step` characters through the streaming parsers.
fn streamed(
    text: &str,
    reasoning: Option<(ReasoningKind, bool)>,
    tools: Option<(ToolKind, Option<&Value>)>,
    step: usize,
) -> Parsed {
    let mut rp = reasoning.map(|(k, t)| ReasoningParser::new(k, t));
    let mut tp = tools.map(|(k, schema)| ToolParser::with_tools(k, "call", schema));
    let (mut r, mut c) = (String::new(), String::new());
    let mut calls: Vec<(String, String)> = Vec::new();
    let mut tool = |text: &str, tp: &mut Option<ToolParser>, c: &mut String, end: bool| {
        let Some(p) = tp else {
            c.push_str(text);
            return;
        };
        let mut o = p.push(text);
        if end {
            let f = p.finish();
            o.content.push_str(&f.content);
            o.calls.extend(f.calls);
        }
        c.push_str(&o.content);
        for d in o.calls {
            if let Some(n) = d.name {
                calls.push((n, String::new()));
            }
            calls[d.index as usize].1.push_str(&d.arguments);
        }
    };
    let chars: Vec<char> = text.chars().collect();
    for piece in chars.chunks(step) {
        let piece: String = piece.iter().collect();
        let content = match &mut rp {
            Some(p) => {
                let (a, b) = p.push(&piece);
                r.push_str(&a);
                b
            }
            None => piece,
        };
        tool(&content, &mut tp, &mut c, false);
    }
    if let Some(p) = &mut rp {
        r.push_str(&p.finish());
    }
    tool("", &mut tp, &mut c, true);
    let complete = tp.as_ref().map_or_else(Vec::new, |p| p.complete_calls());
    // Only calls whose end was seen count, as in the whole parse.
    let calls = calls
        .into_iter()
        .zip(&complete)
        .map(|((n, a), done)| {
            assert_eq!(n, done.name);
            (n, serde_json::from_str(&a).unwrap_or(Value::String(a)))
        })
        .collect();
    (some(r), some(c), calls)
}

/// Cases where dstwin deliberately differs, with why. The test fails if one of them starts to
/// agree (the list is then out of date) or another one differs.
const DIFFERENT: &[(&str, &str)] = &[(
    "tests/reasoning/test_deepseekr1_reasoning_parser.py::test_reasoning::new_line_streaming",
    "vLLM's streaming keeps the newline before <think> in the reasoning, where its whole parse \
     of the same text (case new_line) drops it; dstwin streams what the whole parse gives",
)];

#[test]
fn vllms_deepseek_parser_cases_pass_whole_and_streamed() {
    let mut failed = Vec::new();
    let cases = cases();
    for case in &cases {
        let id = case["id"].as_str().unwrap();
        let input = case["input"].as_str().unwrap();
        let parser = case["parser"].as_str().unwrap();
        let thinking = case["thinking"].as_bool().unwrap_or(false);
        // `tool_choice` "none": the request's tools are not for calling (dstwin then runs no
        // tool parser; vLLM's test runs it without recovering calls).
        let schema = case
            .get("tools")
            .filter(|t| !t.is_null() && case["tool_choice"] != "none");
        // V4's reasoning cases hand their content to V4's tool parser, as vLLM's tests do.
        let (reasoning, tools) = match case["kind"].as_str().unwrap() {
            "reasoning" => (
                Some((ReasoningKind::from_name(parser).unwrap(), thinking)),
                (parser == "deepseek_v4").then_some((ToolKind::DeepseekV4, schema)),
            ),
            _ => (None, Some((ToolKind::from_name(parser).unwrap(), schema))),
        };
        let e = &case["expected"];
        let want_calls: Vec<(String, Value)> = e["tool_calls"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|c| {
                        // A call whose arguments are not JSON carries them raw.
                        let a = match c.get("arguments_raw").and_then(Value::as_str) {
                            Some(raw) => Value::String(raw.to_string()),
                            None => c["arguments"].clone(),
                        };
                        (c["name"].as_str().unwrap().to_string(), a)
                    })
                    .collect()
            })
            .unwrap_or_default();
        let want_content = e["content"]
            .as_str()
            .map(str::to_string)
            .filter(|s| !s.is_empty());
        let want_reasoning = e["reasoning"]
            .as_str()
            .map(str::to_string)
            .filter(|s| !s.is_empty());
        let check = |how: &str, got: &Parsed, failed: &mut Vec<String>| {
            let (r, c, k) = got;
            let reasoning_ok = case["kind"] != "reasoning" || *r == want_reasoning;
            if !reasoning_ok || *c != want_content || *k != want_calls {
                failed.push(format!(
                    "{id} ({how}): got reasoning {r:?} content {c:?} calls {k:?}; want reasoning {want_reasoning:?} content {want_content:?} calls {want_calls:?}"
                ));
            }
        };
        if id.starts_with("tests/reasoning/") {
            // vLLM's reasoning tests check the reasoning parser's content, and (some) that its
            // content parses as a call.
            let (r, c, _) = parse_whole_with(input, reasoning, None);
            let k = match (&c, tools) {
                (Some(c), Some((k, s))) if !want_calls.is_empty() => {
                    calls_json(&parse_whole_with(c, None, Some((k, "call", s))).2)
                }
                _ => Vec::new(),
            };
            check("whole", &(r, c, k), &mut failed);
            for step in [1, 3, 7] {
                let (r, c, _) = streamed(input, reasoning, None, step);
                let k = match (&c, tools) {
                    (Some(c), Some(t)) if !want_calls.is_empty() => {
                        streamed(c, None, Some(t), step).2
                    }
                    _ => Vec::new(),
                };
                check(&format!("streamed by {step}"), &(r, c, k), &mut failed);
            }
            continue;
        }
        let (r, c, k) = parse_whole_with(input, reasoning, tools.map(|(k, s)| (k, "call", s)));
        check("whole", &(r, c, calls_json(&k)), &mut failed);
        for step in [1, 3, 7] {
            check(
                &format!("streamed by {step}"),
                &streamed(input, reasoning, tools, step),
                &mut failed,
            );
        }
    }
    let known = |f: &String| {
        DIFFERENT
            .iter()
            .any(|(id, _)| f.starts_with(&format!("{id} (")))
    };
    for (id, why) in DIFFERENT {
        assert!(
            failed.iter().any(|f| f.starts_with(&format!("{id} ("))),
            "{id} now agrees with vLLM: drop it from DIFFERENT ({why})"
        );
    }
    let unexpected: Vec<&String> = failed.iter().filter(|f| !known(f)).collect();
    assert!(
        unexpected.is_empty(),
        "{} of {} cases x 4 ways differ from vLLM:\n{}",
        unexpected.len(),
        cases.len(),
        unexpected
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(cases.len() >= 100, "{} cases", cases.len());
}
