//! `dstwin bench-serve`: a load generator for OpenAI-compatible servers (`dstwin serve` or a
//! real vLLM / vllm-ascend deployment), reporting what `vllm bench serve` reports, so twin
//! predictions and a real server are compared with one tool.

use crate::Failure;
use anyhow::{anyhow, Context};
use axum::body::Bytes;
use clap::Args;
use dstwin_sim::scenario::load_path;
use dstwin_traces::spec::MAX_RATE_PER_S;
use dstwin_traces::WorkloadSource;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rand::SeedableRng;
use rand_distr::{Distribution, Exp};
use serde::Serialize;
use serde_json::Value;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  dstwin bench-serve --url http://127.0.0.1:8000 --num-prompts 200 --input-len 1024 --output-len 128 --request-rate 8\n  dstwin bench-serve --url http://127.0.0.1:8000 --max-concurrency 32 --num-prompts 500 --json\n  dstwin bench-serve --url http://127.0.0.1:8000 --scenario sim/scenarios/a3-2p1d.toml --save-result run.json\n      (the scenario's [workload]: the same requests `dstwin simulate` predicts for)\n\nEach request is a streamed /v1/completions call with the prompt as token ids (exact input\nlength; no two prompts share a token block unless the scenario's trace gives them the same\nprefix ids), max_tokens = the output length and ignore_eos. The report has the fields of\n`vllm bench serve --save-result` (request/output/total-token throughput, mean/median/p90/p99\nTTFT, TPOT, ITL, E2E in ms)."
)]
pub struct BenchArgs {
    /// Server base URL (http only). Every request carries OPENAI_API_KEY, when set, as
    /// `Authorization: Bearer KEY` (as `vllm bench serve` does; for a server run with
    /// --api-key).
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    url: String,
    /// Model name to request (default: the first model `GET /v1/models` lists).
    #[arg(long)]
    model: Option<String>,
    /// Take the requests from this scenario's [workload] (synthetic, trace or closed loop).
    #[arg(long, conflicts_with_all = ["input_len", "output_len", "request_rate"])]
    scenario: Option<PathBuf>,
    /// Override a field of --scenario: PATH=VALUE (repeatable), as for `simulate`.
    #[arg(long = "set", value_name = "PATH=VALUE", requires = "scenario")]
    sets: Vec<String>,
    /// Requests to send (with --input-len/--output-len); at most 100,000,000 (every request's
    /// timings are kept for the report).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=MAX_PROMPTS))]
    num_prompts: u64,
    /// Prompt tokens per request: 1 to 2,097,152 (twice the longest DeepSeek context; the
    /// prompt text is built in memory).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=MAX_TOKENS))]
    input_len: u32,
    /// Output tokens per request: 1 to 2,097,152.
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=MAX_TOKENS))]
    output_len: u32,
    /// Arrivals at this many requests per second (default: all at once): Poisson, or gamma
    /// with --burstiness.
    #[arg(long)]
    request_rate: Option<f64>,
    /// Burstiness of arrivals, as in `vllm bench serve`: the shape of the gamma distribution of
    /// inter-arrival times (1 = Poisson; smaller is burstier).
    #[arg(long, default_value_t = 1.0)]
    burstiness: f64,
    /// Service-level objectives for goodput, as in `vllm bench serve`: KEY:MS with KEY ttft,
    /// tpot or e2el (repeatable); requests meeting all of them count toward request_goodput.
    #[arg(long, value_name = "KEY:MS")]
    goodput: Vec<String>,
    /// At most this many requests in flight (1 to 1,000,000).
    #[arg(long, value_parser = concurrency)]
    max_concurrency: Option<usize>,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
    /// Also write the JSON result to this file.
    #[arg(long, value_name = "FILE")]
    save_result: Option<PathBuf>,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
}

/// One request to send.
#[derive(Clone, Debug)]
struct Job {
    at: Duration,
    input: u32,
    output: u32,
    /// Its position in the schedule: prompts without prefix ids are unique per index.
    index: u64,
    /// The workload's prefix ids, one per `hash_block_tokens` tokens of the prompt (a Mooncake
    /// trace's `hash_ids`): equal ids, equal prompt blocks.
    prefix: Option<(Arc<[u64]>, u32)>,
}

/// Prompt token ids are drawn from `PROMPT_TOKEN_LO .. PROMPT_TOKEN_LO + PROMPT_TOKENS`: ids 0
/// and 1 are BOS and EOS in DeepSeek's vocabularies (and the CPU engine's), and 256 ids fit
/// every vocabulary, the tiny checkpoints' included.
const PROMPT_TOKEN_LO: u64 = 2;
const PROMPT_TOKENS: u64 = 256;

/// A 64-bit mix (SplitMix64's finalizer).
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The prompt of a job, as token ids: block `b` of a job with prefix ids is a function of its
/// id alone, so requests sharing ids share those blocks (and the server's prefix cache sees
/// what the twin sees); every other token is a function of (seed, index, position), so prompts
/// without prefix ids share nothing, as the twin assumes of a workload without them.
fn prompt_ids(seed: u64, job: &Job) -> Vec<u32> {
    (0..u64::from(job.input))
        .map(|p| {
            let key = match &job.prefix {
                Some((ids, block)) => ids
                    .get((p / u64::from(*block)) as usize)
                    .map(|id| mix(id ^ 0x5eed_b10c) ^ mix(p % u64::from(*block))),
                None => None,
            }
            .unwrap_or_else(|| mix(mix(seed ^ job.index.rotate_left(32)) ^ p));
            (PROMPT_TOKEN_LO + mix(key) % PROMPT_TOKENS) as u32
        })
        .collect()
}

/// What one request measured.
#[derive(Clone, Debug, Default)]
struct Sample {
    ok: bool,
    error: Option<String>,
    input: u32,
    output: u32,
    /// When it was sent, from the start of the run (s).
    sent: f64,
    ttft: f64,
    e2e: f64,
    itl: Vec<f64>,
    text: String,
    /// When each text chunk arrived, from the start of the run (s).
    chunk_at: Vec<f64>,
}

/// The result, with the fields and names `vllm bench serve --save-result --save-detailed`
/// writes (per-request lists included; `date` is UTC).
#[derive(Serialize, Debug)]
pub struct BenchResult {
    pub date: String,
    pub endpoint_type: &'static str,
    pub backend: &'static str,
    pub label: Option<String>,
    pub model_id: String,
    pub tokenizer_id: String,
    pub num_prompts: u64,
    /// A number, or "inf" when all requests start at once.
    pub request_rate: Value,
    pub burstiness: f64,
    pub max_concurrency: Option<usize>,
    pub ignore_eos: bool,
    pub duration: f64,
    pub completed: u64,
    pub failed: u64,
    pub total_input_tokens: u64,
    pub total_output_tokens: u64,
    pub request_throughput: f64,
    /// Requests per second that met every --goodput objective (null without objectives).
    pub request_goodput: Option<f64>,
    pub output_throughput: f64,
    pub total_token_throughput: f64,
    /// The most output tokens received in one wall-clock second of the run.
    pub max_output_tokens_per_s: f64,
    /// The most requests in flight at once.
    pub max_concurrent_requests: u64,
    pub mean_ttft_ms: f64,
    pub median_ttft_ms: f64,
    pub std_ttft_ms: f64,
    pub p99_ttft_ms: f64,
    /// As `vllm bench serve --metric-percentiles 90` names it.
    pub p90_ttft_ms: f64,
    pub mean_tpot_ms: f64,
    pub median_tpot_ms: f64,
    pub std_tpot_ms: f64,
    pub p99_tpot_ms: f64,
    /// As `vllm bench serve --metric-percentiles 90` names it.
    pub p90_tpot_ms: f64,
    pub mean_itl_ms: f64,
    pub median_itl_ms: f64,
    pub std_itl_ms: f64,
    pub p99_itl_ms: f64,
    /// As `vllm bench serve --metric-percentiles 90` names it.
    pub p90_itl_ms: f64,
    pub mean_e2el_ms: f64,
    pub median_e2el_ms: f64,
    pub std_e2el_ms: f64,
    pub p99_e2el_ms: f64,
    /// As `vllm bench serve --metric-percentiles 90` names it.
    pub p90_e2el_ms: f64,
    /// Mean TTFT as the server measured it (its `vllm:time_to_first_token_seconds` histogram,
    /// read from `/metrics` before and after the run), ms; null when the server exports no
    /// such metric. Not in vLLM's file: the client's TTFT less this is the front end's time
    /// (HTTP, tokenizing, streaming back), which `calibrate --trace --bench` fits.
    pub server_mean_ttft_ms: Option<f64>,
    /// The server's `--time-scale` as its `/v1/models` says (a `dstwin serve` twin: wall
    /// seconds per predicted second); null for a server that does not say (vLLM), which runs
    /// in real time. Not in vLLM's file: `validate --measured` refuses a result whose time
    /// scale is not 1, whose times are not the deployment's.
    pub time_scale: Option<f64>,
    /// Real-time factor of audio transcription: 0 for text, as vLLM writes it for text.
    pub rtfx: f64,
    /// The speculative-decoding summary, from the server's `vllm:spec_decode_*` counters over
    /// the run (absent when it drafted nothing), as vLLM writes it.
    #[serde(flatten)]
    pub spec_decode: Option<SpecDecodeResult>,
    pub input_lens: Vec<u32>,
    pub output_lens: Vec<u32>,
    /// Seconds, per request (0 for failed ones).
    pub ttfts: Vec<f64>,
    /// When each request was sent, seconds from the start of the run (vLLM writes
    /// `perf_counter` readings, whose origin means nothing: only differences do).
    pub start_times: Vec<f64>,
    /// Seconds, per request.
    pub itls: Vec<Vec<f64>>,
    pub generated_texts: Vec<String>,
    /// Per request: "" when it succeeded.
    pub errors: Vec<String>,
}

/// `vllm bench serve`'s speculative-decoding fields: the acceptance rate in percent of the
/// draft tokens, the mean tokens per draft pass (1 + accepted / drafts), the counts, and per
/// draft position the share of drafts accepted there.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct SpecDecodeResult {
    pub spec_decode_acceptance_rate: f64,
    pub spec_decode_acceptance_length: f64,
    pub spec_decode_num_drafts: u64,
    pub spec_decode_draft_tokens: u64,
    pub spec_decode_accepted_tokens: u64,
    pub spec_decode_per_position_acceptance_rates: Vec<f64>,
}

/// mean, median, standard deviation, p99, p90 of `v` in milliseconds (zeros when empty).
fn stats_ms(mut v: Vec<f64>) -> [f64; 5] {
    if v.is_empty() {
        return [0.0; 5];
    }
    v.sort_by(f64::total_cmp);
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let std = (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt();
    // Linear interpolation between closest ranks, as numpy.percentile.
    let q = |p: f64| dstwin_traces::quantile(&v, p);
    [
        mean * 1e3,
        q(0.5) * 1e3,
        std * 1e3,
        q(0.99) * 1e3,
        q(0.9) * 1e3,
    ]
}

/// Goodput objectives (seconds) parsed from KEY:MS.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Slo {
    ttft: Option<f64>,
    tpot: Option<f64>,
    e2el: Option<f64>,
}

fn slos(v: &[String]) -> Result<Option<Slo>, Failure> {
    if v.is_empty() {
        return Ok(None);
    }
    let mut s = Slo::default();
    for item in v {
        let bad = || {
            Failure::Input(anyhow!("--goodput {item:?}: expected KEY:MS with KEY ttft, tpot or e2el and MS a positive number"))
        };
        let (k, ms) = item.split_once(':').ok_or_else(bad)?;
        let ms: f64 = ms.trim().parse().map_err(|_| bad())?;
        if !(ms.is_finite() && ms > 0.0) {
            return Err(bad());
        }
        let slot = match k.trim() {
            "ttft" => &mut s.ttft,
            "tpot" => &mut s.tpot,
            "e2el" => &mut s.e2el,
            _ => return Err(bad()),
        };
        *slot = Some(ms / 1e3);
    }
    Ok(Some(s))
}

/// A date like vLLM's `%Y%m%d-%H%M%S` (UTC).
fn date_utc() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// The longest prompt or output `--input-len`/`--output-len` take.
const MAX_TOKENS: i64 = 2 * 1024 * 1024;
/// The most requests one benchmark sends, from `--num-prompts` or a scenario: the schedule is
/// made up front and every request's timings are kept for the report (hundreds of bytes each),
/// so 10^8 requests is already tens of GB.
const MAX_PROMPTS: u64 = 100_000_000;

fn too_many_prompts() -> Failure {
    Failure::Input(anyhow!(
        "the scenario's workload sends more than {MAX_PROMPTS} requests; bench-serve keeps every \
         request's timings, so shorten it (num_requests, duration_s, max_requests)"
    ))
}

/// `--max-concurrency`: 1 to the closed-loop bound of a scenario's workload.
fn concurrency(s: &str) -> Result<usize, String> {
    let max = dstwin_traces::spec::MAX_CONCURRENCY as usize;
    match s.parse::<usize>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(format!("must be a whole number from 1 to {max}")),
    }
}

fn jobs(a: &BenchArgs) -> Result<(Vec<Job>, Option<usize>), Failure> {
    if let Some(p) = &a.scenario {
        let s = load_path(p, &a.sets).map_err(|e| Failure::Input(e.into()))?;
        let src = s
            .workload
            .build(s.seed, &s.base_dir)
            .map_err(|e| Failure::Input(e.into()))?;
        return Ok(match src {
            WorkloadSource::Open(mut stream) => {
                // Every request is sent from a schedule made up front.
                let t0 = stream.first_arrival_ns();
                let block = stream.hash_block_tokens();
                let mut v = Vec::new();
                while let Some(r) = stream
                    .next_request()
                    .map_err(|e| Failure::Input(e.into()))?
                {
                    if v.len() as u64 == MAX_PROMPTS {
                        return Err(too_many_prompts());
                    }
                    let ids = stream.hash_ids();
                    v.push(Job {
                        at: Duration::from_nanos(r.arrival_ns - t0),
                        input: r.input_tokens,
                        output: r.output_tokens,
                        index: v.len() as u64,
                        prefix: block
                            .filter(|b| *b > 0 && !ids.is_empty())
                            .map(|b| (Arc::from(ids), b)),
                    });
                }
                (v, a.max_concurrency)
            }
            WorkloadSource::ClosedLoop {
                concurrency,
                num_requests,
                mut sampler,
                mut pace,
            } => {
                if num_requests.get() > MAX_PROMPTS {
                    return Err(too_many_prompts());
                }
                // A paced loop sends request k at the k-th arrival, as the concurrency allows.
                let v = (0..num_requests.get())
                    .map(|index| {
                        let l = sampler.next_lengths();
                        let at = pace.as_mut().and_then(Iterator::next).unwrap_or(0);
                        Job {
                            at: Duration::from_nanos(at),
                            input: l.input_tokens,
                            output: l.output_tokens,
                            index,
                            prefix: None,
                        }
                    })
                    .collect();
                (v, Some(concurrency.get() as usize))
            }
        });
    }
    if a.num_prompts == 0 || a.input_len == 0 || a.output_len == 0 {
        return Err(Failure::Input(anyhow!(
            "--num-prompts, --input-len and --output-len must be at least 1"
        )));
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(a.seed);
    let exp = match a.request_rate {
        Some(r) if !(r.is_finite() && r > 0.0 && r <= MAX_RATE_PER_S) => {
            return Err(Failure::Input(anyhow!(
                "--request-rate {r}: must be a positive number of requests per second, at most {MAX_RATE_PER_S:.0}"
            )))
        }
        Some(r) => Some(Exp::new(r).map_err(|e| Failure::Input(anyhow!("--request-rate: {e}")))?),
        None => None,
    };
    if !(a.burstiness.is_finite() && a.burstiness > 0.0) {
        return Err(Failure::Input(anyhow!(
            "--burstiness must be a positive number, got {}",
            a.burstiness
        )));
    }
    // Gamma inter-arrivals with mean 1/rate; shape 1 is the exponential (Poisson arrivals).
    let gamma = match a.request_rate {
        Some(r) if a.burstiness != 1.0 => Some(
            rand_distr::Gamma::new(a.burstiness, 1.0 / (r * a.burstiness))
                .map_err(|e| Failure::Input(anyhow!("--burstiness: {e}")))?,
        ),
        _ => None,
    };
    let mut t = 0.0;
    let v = (0..a.num_prompts)
        .map(|index| {
            let at = Duration::from_secs_f64(t);
            if let Some(g) = &gamma {
                t += g.sample(&mut rng);
            } else if let Some(e) = &exp {
                t += e.sample(&mut rng);
            }
            Job {
                at,
                input: a.input_len,
                output: a.output_len,
                index,
                prefix: None,
            }
        })
        .collect();
    Ok((v, a.max_concurrency))
}

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

/// The client, and the API key every request carries as `Authorization: Bearer KEY` (as
/// `vllm bench serve` sends `OPENAI_API_KEY`; none when it is unset or empty).
#[derive(Clone)]
struct Http {
    client: HttpClient,
    key: Option<Arc<str>>,
}

impl Http {
    fn send(
        &self,
        req: hyper::http::request::Builder,
        body: Bytes,
    ) -> anyhow::Result<hyper_util::client::legacy::ResponseFuture> {
        let req = match &self.key {
            Some(k) => req.header("authorization", format!("Bearer {k}")),
            None => req,
        };
        Ok(self.client.request(req.body(Full::new(body))?))
    }
}

/// The series of `name` in Prometheus text (`/metrics`), each as (its labels, its value).
fn series<'a>(text: &'a str, name: &'a str) -> impl Iterator<Item = (&'a str, f64)> + 'a {
    text.lines().filter_map(move |l| {
        let rest = l.strip_prefix(name)?;
        // `name{labels} value` or `name value`.
        let (labels, value) = match rest.strip_prefix('{') {
            Some(r) => r.split_once('}')?,
            None => ("", rest.strip_prefix(' ')?),
        };
        Some((labels, value.split_whitespace().next()?.parse().ok()?))
    })
}

/// The sum of `name`'s series over every label set; `None` without one.
fn total(text: &str, name: &str) -> Option<f64> {
    series(text, name).map(|(_, v)| v).reduce(|a, b| a + b)
}

/// The server's TTFT histogram in Prometheus text (`/metrics`): (sum in seconds, count) over
/// every label set; `None` without one.
fn ttft_histogram(text: &str) -> Option<(f64, f64)> {
    Some((
        total(text, "vllm:time_to_first_token_seconds_sum")?,
        total(text, "vllm:time_to_first_token_seconds_count")?,
    ))
}

/// The server's speculative-decoding counters in Prometheus text: drafts, draft tokens,
/// accepted tokens, and accepted tokens by draft position, summed over engines.
#[derive(Clone, Debug, Default, PartialEq)]
struct SpecCounters {
    drafts: f64,
    draft_tokens: f64,
    accepted: f64,
    per_position: Vec<f64>,
}

fn spec_counters(text: &str) -> Option<SpecCounters> {
    let mut per_position = Vec::new();
    for (labels, v) in series(text, "vllm:spec_decode_num_accepted_tokens_per_pos_total") {
        let pos = labels
            .split(',')
            .find_map(|kv| kv.strip_prefix("position=\""))
            .and_then(|p| p.trim_end_matches('"').parse::<usize>().ok());
        if let Some(p) = pos {
            if per_position.len() <= p {
                per_position.resize(p + 1, 0.0);
            }
            per_position[p] += v;
        }
    }
    Some(SpecCounters {
        drafts: total(text, "vllm:spec_decode_num_drafts_total")?,
        draft_tokens: total(text, "vllm:spec_decode_num_draft_tokens_total")?,
        accepted: total(text, "vllm:spec_decode_num_accepted_tokens_total")?,
        per_position,
    })
}

/// The speculative-decoding summary `vllm bench serve` writes, from the server's counters
/// before and after the run; `None` when it drafted nothing (or exports no such counters).
fn spec_decode_result(before: &str, after: &str) -> Option<SpecDecodeResult> {
    let (b, a) = (spec_counters(before)?, spec_counters(after)?);
    let drafts = a.drafts - b.drafts;
    let draft_tokens = a.draft_tokens - b.draft_tokens;
    if drafts <= 0.0 || draft_tokens <= 0.0 {
        return None;
    }
    let accepted = a.accepted - b.accepted;
    let per_position = a
        .per_position
        .iter()
        .enumerate()
        .map(|(i, x)| (x - b.per_position.get(i).copied().unwrap_or(0.0)) / drafts)
        .collect();
    Some(SpecDecodeResult {
        spec_decode_acceptance_rate: accepted / draft_tokens * 100.0,
        spec_decode_acceptance_length: 1.0 + accepted / drafts,
        spec_decode_num_drafts: drafts as u64,
        spec_decode_draft_tokens: draft_tokens as u64,
        spec_decode_accepted_tokens: accepted as u64,
        spec_decode_per_position_acceptance_rates: per_position,
    })
}

/// The server's `/metrics` text now, when it has one.
async fn server_metrics(http: &Http, base: &str) -> Option<String> {
    let body = get_body(http, &format!("{base}/metrics")).await.ok()?;
    Some(String::from_utf8_lossy(&body).into_owned())
}

/// The body of a successful GET of `url`.
async fn get_body(http: &Http, url: &str) -> anyhow::Result<Bytes> {
    let uri: hyper::Uri = url.parse().with_context(|| format!("bad URL {url}"))?;
    let resp = http
        .send(hyper::Request::get(uri), Bytes::new())?
        .await
        .with_context(|| format!("GET {url}"))?;
    let status = resp.status();
    let body = resp.into_body().collect().await?.to_bytes();
    if !status.is_success() {
        return Err(anyhow!("GET {url}: {status}"));
    }
    Ok(body)
}

async fn get_json(http: &Http, url: &str) -> anyhow::Result<serde_json::Value> {
    Ok(serde_json::from_slice(&get_body(http, url).await?)?)
}

/// Whether a streamed chunk's JSON `payload` is a token chunk, and whether it has text. A token
/// chunk has a choice with text or is not the closing one: as `vllm bench serve` counts, a
/// token whose text is still empty (part of a UTF-8 sequence, a special token) was made when
/// its chunk came, and the first token is the first such chunk. A closing chunk without text
/// (finish reason only) and the usage chunk (no choices) are no tokens. Read from the text, not
/// parsed: this runs for every token of every stream.
fn token_chunk(payload: &str) -> (bool, bool) {
    let has_text = ["\"text\":\"", "\"content\":\""].iter().any(|k| {
        payload
            .find(k)
            .is_some_and(|p| payload.as_bytes().get(p + k.len()) != Some(&b'"'))
    });
    let open = payload.contains("\"choices\":[{") && payload.contains("\"finish_reason\":null");
    (has_text || open, has_text)
}

async fn one(
    http: Http,
    url: String,
    model: String,
    prompt: Vec<u32>,
    job: Job,
    t0: Instant,
) -> Sample {
    let mut s = Sample {
        input: job.input,
        sent: t0.elapsed().as_secs_f64(),
        ..Sample::default()
    };
    let body = serde_json::json!({
        "model": model,
        "prompt": prompt,
        "max_tokens": job.output,
        "stream": true,
        "stream_options": {"include_usage": true},
        "ignore_eos": true,
    });
    let req = hyper::Request::post(&url).header("content-type", "application/json");
    let pending = match http.send(req, Bytes::from(body.to_string())) {
        Ok(r) => r,
        Err(e) => {
            s.error = Some(e.to_string());
            return s;
        }
    };
    let start = Instant::now();
    let resp = match pending.await {
        Ok(r) => r,
        Err(e) => {
            s.error = Some(format!("{e:#}"));
            return s;
        }
    };
    if !resp.status().is_success() {
        let status = resp.status();
        let b = resp.into_body().collect().await.map(|b| b.to_bytes());
        s.error = Some(format!(
            "{status}: {}",
            b.map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default()
        ));
        return s;
    }
    let mut body = resp.into_body();
    let mut buf: Vec<u8> = Vec::new();
    let mut last: Option<Instant> = None;
    let mut chunks = 0u32;
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(f) => f,
            Err(e) => {
                s.error = Some(e.to_string());
                return s;
            }
        };
        let Some(data) = frame.data_ref() else {
            continue;
        };
        buf.extend_from_slice(data);
        while let Some(pos) = buf.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = buf.drain(..pos + 2).collect();
            let line = String::from_utf8_lossy(&event);
            let Some(payload) = line.trim().strip_prefix("data:") else {
                continue;
            };
            let payload = payload.trim();
            if payload == "[DONE]" {
                s.ok = true;
                continue;
            }
            // Parse only the usage chunk.
            if payload.contains("\"usage\"") {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(payload) {
                    if let Some(u) = v.get("usage").and_then(|u| u.get("completion_tokens")) {
                        s.output = u.as_u64().unwrap_or(0) as u32;
                    }
                }
            }
            let (token, has_text) = token_chunk(payload);
            if token {
                if has_text {
                    if let Ok(v) = serde_json::from_str::<serde_json::Value>(payload) {
                        let c = &v["choices"][0];
                        if let Some(t) = c["text"].as_str().or(c["delta"]["content"].as_str()) {
                            s.text.push_str(t);
                        }
                    }
                }
                let now = Instant::now();
                s.chunk_at.push((now - t0).as_secs_f64());
                match last {
                    None => s.ttft = (now - start).as_secs_f64(),
                    Some(l) => s.itl.push((now - l).as_secs_f64()),
                }
                last = Some(now);
                chunks += 1;
            }
        }
    }
    s.e2e = start.elapsed().as_secs_f64();
    if s.output == 0 {
        s.output = chunks;
    }
    if !s.ok {
        s.error = Some("the stream ended without [DONE]".into());
    }
    s
}

pub fn run(a: BenchArgs) -> Result<(), Failure> {
    let (jobs, concurrency) = jobs(&a)?;
    let slo = slos(&a.goodput)?;
    if let Some(p) = &a.save_result {
        // Found now, not after the benchmark.
        crate::output::check_file(p, "--save-result")?;
    }
    if concurrency == Some(0) {
        return Err(Failure::Input(anyhow!(
            "--max-concurrency must be at least 1"
        )));
    }
    let tokio = tokio::runtime::Runtime::new()
        .context("starting the async runtime")
        .map_err(Failure::Runtime)?;
    let run = tokio.block_on(bench(&a, jobs, concurrency))?;
    let model = run.model;
    let mut result = summarize(run.samples, run.duration, slo);
    result.server_mean_ttft_ms = run.server_ttft;
    result.spec_decode = run.spec;
    result.time_scale = run.time_scale;
    result.model_id = model.clone();
    result.tokenizer_id = model;
    result.max_concurrency = concurrency;
    result.request_rate = a
        .request_rate
        .map_or_else(|| Value::from("inf"), Value::from);
    result.burstiness = a.burstiness;
    let json = serde_json::to_string_pretty(&result).map_err(|e| Failure::Runtime(e.into()))?;
    if let Some(p) = &a.save_result {
        crate::output::write_file(p, json.as_bytes())?;
    }
    if a.json {
        crate::output::outln!("{json}")?;
    } else {
        crate::output::out!("{}", render(&result))?;
    }
    if result.completed == 0 {
        let first = result
            .errors
            .iter()
            .find(|e| !e.is_empty())
            .map_or("no error reported", String::as_str);
        return Err(Failure::Runtime(anyhow!(
            "every request failed ({} of {}); the first error: {first}",
            result.failed,
            result.num_prompts
        )));
    }
    Ok(())
}

/// What a benchmark run returns: every request's sample and what the server said.
struct BenchRun {
    samples: Vec<Sample>,
    /// Seconds.
    duration: f64,
    /// The model asked for.
    model: String,
    /// The server's own mean TTFT over the run, ms.
    server_ttft: Option<f64>,
    /// What the server's speculative decoding drafted and accepted over the run.
    spec: Option<SpecDecodeResult>,
    /// The server's `--time-scale`, if it says.
    time_scale: Option<f64>,
}

/// Sends the jobs; returns every request's sample, the run's duration and the model asked for.
async fn bench(
    a: &BenchArgs,
    jobs: Vec<Job>,
    concurrency: Option<usize>,
) -> Result<BenchRun, Failure> {
    let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
    connector.set_nodelay(true);
    let client: HttpClient = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1024)
        .build(connector);
    let key = std::env::var("OPENAI_API_KEY")
        .ok()
        .filter(|k| !k.is_empty());
    let http = Http {
        client,
        key: key.map(Arc::from),
    };
    let base = a.url.trim_end_matches('/').to_string();
    // The model list names the model when --model does not, and a twin's time scale.
    let models = get_json(&http, &format!("{base}/v1/models")).await;
    let time_scale = models
        .as_ref()
        .ok()
        .and_then(|v| v["data"][0]["time_scale"].as_f64());
    let model = match &a.model {
        Some(m) => m.clone(),
        None => models.map_err(Failure::Runtime)?["data"][0]["id"]
            .as_str()
            .ok_or_else(|| Failure::Runtime(anyhow!("{base}/v1/models lists no model")))?
            .to_string(),
    };
    let url = format!("{base}/v1/completions");
    let before = server_metrics(&http, &base).await;
    let bar = crate::progress::bar(
        Some(jobs.len() as u64),
        a.quiet,
        "{bar:40} {pos}/{len} requests [{elapsed_precise}, eta {eta}]",
    );
    let limit = Arc::new(tokio::sync::Semaphore::new(
        concurrency.unwrap_or(tokio::sync::Semaphore::MAX_PERMITS),
    ));
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(jobs.len());
    for job in jobs {
        let wait = job.at.saturating_sub(start.elapsed());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        let permit = limit
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| Failure::Runtime(e.into()))?;
        let (http, url, model, bar) = (http.clone(), url.clone(), model.clone(), bar.clone());
        let prompt = prompt_ids(a.seed, &job);
        tasks.push(tokio::spawn(async move {
            let s = one(http, url, model, prompt, job, start).await;
            drop(permit);
            bar.inc(1);
            s
        }));
    }
    let mut samples = Vec::with_capacity(tasks.len());
    for t in tasks {
        samples.push(t.await.map_err(|e| Failure::Runtime(e.into()))?);
    }
    let duration = start.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let after = server_metrics(&http, &base).await;
    let (before, after) = (before.as_deref(), after.as_deref());
    // The server's mean TTFT over this run's requests (its histogram's growth).
    let server = match (
        before.and_then(ttft_histogram),
        after.and_then(ttft_histogram),
    ) {
        (Some((s0, c0)), Some((s1, c1))) if c1 > c0 => Some((s1 - s0) / (c1 - c0) * 1e3),
        _ => None,
    };
    let spec = before
        .zip(after)
        .and_then(|(b, a)| spec_decode_result(b, a));
    Ok(BenchRun {
        samples,
        duration,
        model,
        server_ttft: server,
        spec,
        time_scale,
    })
}

/// The report over all samples (run metadata is filled in by the caller).
fn summarize(samples: Vec<Sample>, duration: f64, slo: Option<Slo>) -> BenchResult {
    let ok: Vec<&Sample> = samples.iter().filter(|s| s.ok).collect();
    let total_in: u64 = ok.iter().map(|s| s.input as u64).sum();
    let total_out: u64 = ok.iter().map(|s| s.output as u64).sum();
    let tpot_of = |s: &Sample| (s.output > 1).then(|| (s.e2e - s.ttft) / (s.output - 1) as f64);
    let ttft = stats_ms(ok.iter().map(|s| s.ttft).collect());
    let tpot = stats_ms(ok.iter().filter_map(|s| tpot_of(s)).collect());
    let itl = stats_ms(ok.iter().flat_map(|s| s.itl.iter().copied()).collect());
    let e2e = stats_ms(ok.iter().map(|s| s.e2e).collect());
    let d = duration.max(1e-9);
    let good = slo.map(|o| {
        let meets = |s: &Sample| {
            o.ttft.is_none_or(|x| s.ttft <= x)
                && o.tpot.is_none_or(|x| tpot_of(s).is_none_or(|t| t <= x))
                && o.e2el.is_none_or(|x| s.e2e <= x)
        };
        ok.iter().filter(|s| meets(s)).count() as f64 / d
    });
    // Output tokens per wall-clock second: each request's tokens spread over its chunks.
    let mut per_s: Vec<f64> = vec![0.0; duration.ceil().max(1.0) as usize + 1];
    for s in &ok {
        let each = s.output as f64 / s.chunk_at.len().max(1) as f64;
        for &t in &s.chunk_at {
            let i = (t.max(0.0) as usize).min(per_s.len() - 1);
            per_s[i] += each;
        }
    }
    // Requests in flight: +1 at send, -1 at the end, swept in time order.
    let mut edges: Vec<(f64, i64)> = samples
        .iter()
        .flat_map(|s| [(s.sent, 1), (s.sent + s.e2e.max(0.0), -1)])
        .collect();
    edges.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut live = 0i64;
    let mut most = 0i64;
    for (_, e) in edges {
        live += e;
        most = most.max(live);
    }
    BenchResult {
        date: date_utc(),
        endpoint_type: "openai",
        backend: "openai",
        label: None,
        model_id: String::new(),
        tokenizer_id: String::new(),
        num_prompts: samples.len() as u64,
        request_rate: Value::from("inf"),
        burstiness: 1.0,
        max_concurrency: None,
        ignore_eos: true,
        duration,
        completed: ok.len() as u64,
        failed: (samples.len() - ok.len()) as u64,
        total_input_tokens: total_in,
        total_output_tokens: total_out,
        request_throughput: ok.len() as f64 / d,
        request_goodput: good,
        output_throughput: total_out as f64 / d,
        total_token_throughput: (total_in + total_out) as f64 / d,
        max_output_tokens_per_s: per_s.iter().copied().fold(0.0, f64::max),
        max_concurrent_requests: most as u64,
        mean_ttft_ms: ttft[0],
        median_ttft_ms: ttft[1],
        std_ttft_ms: ttft[2],
        p99_ttft_ms: ttft[3],
        p90_ttft_ms: ttft[4],
        mean_tpot_ms: tpot[0],
        median_tpot_ms: tpot[1],
        std_tpot_ms: tpot[2],
        p99_tpot_ms: tpot[3],
        p90_tpot_ms: tpot[4],
        mean_itl_ms: itl[0],
        median_itl_ms: itl[1],
        std_itl_ms: itl[2],
        p99_itl_ms: itl[3],
        p90_itl_ms: itl[4],
        mean_e2el_ms: e2e[0],
        median_e2el_ms: e2e[1],
        std_e2el_ms: e2e[2],
        p99_e2el_ms: e2e[3],
        p90_e2el_ms: e2e[4],
        server_mean_ttft_ms: None,
        time_scale: None,
        rtfx: 0.0,
        spec_decode: None,
        input_lens: samples.iter().map(|s| s.input).collect(),
        output_lens: samples
            .iter()
            .map(|s| if s.ok { s.output } else { 0 })
            .collect(),
        ttfts: samples
            .iter()
            .map(|s| if s.ok { s.ttft } else { 0.0 })
            .collect(),
        itls: samples.iter().map(|s| s.itl.clone()).collect(),
        start_times: samples.iter().map(|s| s.sent).collect(),
        generated_texts: samples.iter().map(|s| s.text.clone()).collect(),
        errors: samples
            .iter()
            .map(|s| s.error.clone().unwrap_or_default())
            .collect(),
    }
}

fn render(r: &BenchResult) -> String {
    let mut s = String::new();
    let mut line = |k: &str, v: String| s.push_str(&format!("{k:<40}{v:>12}\n"));
    line("Successful requests:", r.completed.to_string());
    line("Failed requests:", r.failed.to_string());
    line("Benchmark duration (s):", format!("{:.2}", r.duration));
    line("Total input tokens:", r.total_input_tokens.to_string());
    line("Total generated tokens:", r.total_output_tokens.to_string());
    line(
        "Request throughput (req/s):",
        format!("{:.2}", r.request_throughput),
    );
    line(
        "Output token throughput (tok/s):",
        format!("{:.2}", r.output_throughput),
    );
    line(
        "Total token throughput (tok/s):",
        format!("{:.2}", r.total_token_throughput),
    );
    for (name, m) in [
        ("TTFT", (r.mean_ttft_ms, r.median_ttft_ms, r.p99_ttft_ms)),
        ("TPOT", (r.mean_tpot_ms, r.median_tpot_ms, r.p99_tpot_ms)),
        ("ITL", (r.mean_itl_ms, r.median_itl_ms, r.p99_itl_ms)),
        (
            "E2E latency",
            (r.mean_e2el_ms, r.median_e2el_ms, r.p99_e2el_ms),
        ),
    ] {
        line(&format!("Mean {name} (ms):"), format!("{:.2}", m.0));
        line(&format!("Median {name} (ms):"), format!("{:.2}", m.1));
        line(&format!("P99 {name} (ms):"), format!("{:.2}", m.2));
    }
    if let Some(g) = r.request_goodput {
        line("Request goodput (req/s):", format!("{g:.2}"));
    }
    if let Some(d) = &r.spec_decode {
        line(&format!("{:-^52}", "Speculative Decoding"), String::new());
        line(
            "Acceptance rate (%):",
            format!("{:.2}", d.spec_decode_acceptance_rate),
        );
        line(
            "Acceptance length:",
            format!("{:.2}", d.spec_decode_acceptance_length),
        );
        line("Drafts:", d.spec_decode_num_drafts.to_string());
        line("Draft tokens:", d.spec_decode_draft_tokens.to_string());
        line(
            "Accepted tokens:",
            d.spec_decode_accepted_tokens.to_string(),
        );
        for (i, a) in d
            .spec_decode_per_position_acceptance_rates
            .iter()
            .enumerate()
        {
            line(
                &format!("Acceptance at position {i} (%):"),
                format!("{:.2}", a * 100.0),
            );
        }
    }
    let mut errors: Vec<&String> = r.errors.iter().filter(|e| !e.is_empty()).collect();
    errors.sort();
    errors.dedup();
    for e in errors.iter().take(10) {
        s.push_str(&format!("error: {e}\n"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(index: u64, input: u32, prefix: Option<&[u64]>) -> Job {
        Job {
            at: Duration::ZERO,
            input,
            output: 1,
            index,
            prefix: prefix.map(|ids| (Arc::from(ids), 4)),
        }
    }

    #[test]
    fn the_servers_ttft_histogram_is_read_over_every_label_set() {
        let text = "# HELP vllm:time_to_first_token_seconds x\n\
            vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.1\"} 3\n\
            vllm:time_to_first_token_seconds_sum{engine=\"0\",model_name=\"m\"} 0.25\n\
            vllm:time_to_first_token_seconds_count{engine=\"0\",model_name=\"m\"} 5\n\
            vllm:time_to_first_token_seconds_sum{engine=\"1\",model_name=\"m\"} 0.5\n\
            vllm:time_to_first_token_seconds_count{engine=\"1\",model_name=\"m\"} 5\n\
            vllm:e2e_request_latency_seconds_sum{engine=\"0\"} 9\n";
        assert_eq!(ttft_histogram(text), Some((0.75, 10.0)));
        // Without labels, as other exporters write it.
        let bare =
            "vllm:time_to_first_token_seconds_sum 1.5\nvllm:time_to_first_token_seconds_count 3\n";
        assert_eq!(ttft_histogram(bare), Some((1.5, 3.0)));
        assert_eq!(
            ttft_histogram("vllm:e2e_request_latency_seconds_sum 1\n"),
            None
        );
    }

    /// vLLM's speculative-decoding summary from the counters' growth over the run, summed over
    /// engines: rate in percent of draft tokens, length 1 + accepted per draft pass, and per
    /// position the share of passes accepted there.
    #[test]
    fn the_speculative_summary_is_the_counters_growth() {
        let at = |drafts: u32, tokens: u32, accepted: u32, pos: [u32; 2]| {
            format!(
                "vllm:spec_decode_num_drafts_total{{engine=\"0\"}} {drafts}\n\
                 vllm:spec_decode_num_drafts_total{{engine=\"1\"}} 0\n\
                 vllm:spec_decode_num_draft_tokens_total{{engine=\"0\"}} {tokens}\n\
                 vllm:spec_decode_num_accepted_tokens_total{{engine=\"0\"}} {accepted}\n\
                 vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine=\"0\",position=\"0\"}} {}\n\
                 vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine=\"0\",position=\"1\"}} {}\n",
                pos[0], pos[1]
            )
        };
        let before = at(10, 20, 8, [6, 2]);
        // 40 more passes of two drafts: 48 accepted, 32 at the first position, 16 at the second.
        let after = at(50, 100, 56, [38, 18]);
        let r = spec_decode_result(&before, &after).unwrap();
        assert_eq!(r.spec_decode_num_drafts, 40);
        assert_eq!(r.spec_decode_draft_tokens, 80);
        assert_eq!(r.spec_decode_accepted_tokens, 48);
        assert!((r.spec_decode_acceptance_rate - 60.0).abs() < 1e-9);
        assert!((r.spec_decode_acceptance_length - 2.2).abs() < 1e-9);
        assert_eq!(r.spec_decode_per_position_acceptance_rates, vec![0.8, 0.4]);
        // Nothing drafted over the run, or no counters: no summary.
        assert_eq!(spec_decode_result(&after, &after), None);
        assert_eq!(spec_decode_result("", "vllm:up 1\n"), None);
    }

    #[test]
    fn a_token_without_text_is_a_token_and_a_closing_chunk_is_not() {
        let chunk = |text: &str, finish: &str| {
            format!(
                r#"{{"id":"cmpl-0","object":"text_completion","created":1,"model":"m","choices":[{{"index":0,"text":{text},"logprobs":null,"finish_reason":{finish}}}]}}"#
            )
        };
        assert_eq!(token_chunk(&chunk(r#""p""#, "null")), (true, true));
        // The first token may have no text of its own yet: it is still the first token.
        assert_eq!(token_chunk(&chunk(r#""""#, "null")), (true, false));
        // The last token's text with the finish reason is a token; the finish alone is not.
        assert_eq!(token_chunk(&chunk(r#""y""#, r#""length""#)), (true, true));
        assert_eq!(token_chunk(&chunk(r#""""#, r#""length""#)), (false, false));
        let usage = r#"{"choices":[],"created":1,"id":"cmpl-0","model":"m","object":"text_completion","usage":{"completion_tokens":8,"prompt_tokens":6,"total_tokens":14}}"#;
        assert_eq!(token_chunk(usage), (false, false));
        // Chat deltas.
        let delta = r#"{"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}"#;
        assert_eq!(token_chunk(delta), (true, true));
        let empty = r#"{"choices":[{"index":0,"delta":{},"finish_reason":null}]}"#;
        assert_eq!(token_chunk(empty), (true, false));
    }

    #[test]
    fn prompts_share_blocks_exactly_where_their_prefix_ids_do() {
        let range = PROMPT_TOKEN_LO as u32..(PROMPT_TOKEN_LO + PROMPT_TOKENS) as u32;
        // Without prefix ids: every request's own tokens, the same for the same seed.
        let (a, b) = (
            prompt_ids(7, &job(0, 64, None)),
            prompt_ids(7, &job(1, 64, None)),
        );
        assert_eq!(a.len(), 64);
        assert!(a.iter().chain(&b).all(|t| range.contains(t)));
        assert!(a.chunks(4).zip(b.chunks(4)).all(|(x, y)| x != y));
        assert_eq!(a, prompt_ids(7, &job(0, 64, None)));
        assert_ne!(a, prompt_ids(8, &job(0, 64, None)));
        // With ids (4 tokens each): equal ids, equal blocks, whatever the request or seed.
        let x = prompt_ids(1, &job(0, 10, Some(&[5, 6, 9])));
        let y = prompt_ids(2, &job(3, 11, Some(&[5, 6, 8])));
        assert_eq!(x[..8], y[..8]);
        assert_ne!(x[8..10], y[8..10]);
        assert_eq!(y.len(), 11);
        assert!(x.iter().chain(&y).all(|t| range.contains(t)));
    }
}
