//! PD disaggregation routing: the proxy that picks a prefill instance and a decode instance for
//! each request. IO-free; the drivers call it with what happened.
//!
//! Policies:
//! - `load_balance` (vllm-ascend's load-balance proxy): prefill priority = active tokens +
//!   0.3 x active KV load, where each request adds 0.0345 x prompt/4 + 120.0745 KV load until its
//!   decode starts streaming; decode priority = active tokens. Lowest priority wins; ties go to the
//!   lowest index.
//! - `round_robin`.
//! - `prefix_aware`: the prefill instance that served the longest prefix of the request's block
//!   hashes when that prefix covers at least half of the request's blocks, `load_balance`
//!   otherwise.

use serde::{Deserialize, Serialize};

/// KV-load weight of a request in the prefill priority (vllm-ascend proxy constants).
const KV_LOAD_PER_TOKEN: f64 = 0.0345 / 4.0;
const KV_LOAD_BASE: f64 = 120.0745;
const KV_LOAD_WEIGHT: f64 = 0.3;

/// How a role's instances are chosen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    #[default]
    LoadBalance,
    RoundRobin,
    PrefixAware,
}

#[derive(Clone, Debug, Default)]
struct Server {
    active_tokens: f64,
    active_kv: f64,
}

/// One role's instances and their load as the proxy sees it.
#[derive(Clone, Debug)]
pub struct Balancer {
    policy: Policy,
    servers: Vec<Server>,
    next: usize,
    /// Block hash -> the server that last computed it (prefix-aware only).
    owner: rustc_hash::FxHashMap<u64, usize>,
}

impl Balancer {
    pub fn new(policy: Policy, servers: usize) -> Self {
        assert!(servers > 0, "a role needs at least one instance");
        Balancer {
            policy,
            servers: vec![Server::default(); servers],
            next: 0,
            owner: rustc_hash::FxHashMap::default(),
        }
    }

    pub fn len(&self) -> usize {
        self.servers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    fn least(&self, with_kv: bool) -> usize {
        let prio = |s: &Server| {
            s.active_tokens
                + if with_kv {
                    KV_LOAD_WEIGHT * s.active_kv
                } else {
                    0.0
                }
        };
        let mut best = 0;
        for (i, s) in self.servers.iter().enumerate() {
            if prio(s) < prio(&self.servers[best]) {
                best = i;
            }
        }
        best
    }

    /// Picks a server for a request of `tokens` active tokens with block `hashes`;
    /// `with_kv` adds the KV-load term (prefill role).
    fn pick(&mut self, tokens: u64, hashes: &[u64], with_kv: bool) -> usize {
        let i = match self.policy {
            Policy::RoundRobin => {
                let i = self.next % self.servers.len();
                self.next = i + 1;
                i
            }
            Policy::LoadBalance => self.least(with_kv),
            Policy::PrefixAware => {
                // The owner of the longest run of leading hashes wins if it holds at least half
                // of the request's blocks (a shared system prompt alone does not pin traffic).
                let mut owner = None;
                let mut run = 0;
                for h in hashes {
                    match self.owner.get(h) {
                        Some(&o) if owner.is_none_or(|x| x == o) => {
                            owner = Some(o);
                            run += 1;
                        }
                        _ => break,
                    }
                }
                match owner {
                    Some(o) if 2 * run >= hashes.len() => o,
                    _ => self.least(with_kv),
                }
            }
        };
        if self.policy == Policy::PrefixAware {
            for h in hashes {
                self.owner.insert(*h, i);
            }
        }
        let s = &mut self.servers[i];
        s.active_tokens += tokens as f64;
        if with_kv {
            s.active_kv += kv_load(tokens);
        }
        i
    }

    fn release_tokens(&mut self, server: usize, tokens: u64) {
        let s = &mut self.servers[server];
        s.active_tokens = (s.active_tokens - tokens as f64).max(0.0);
    }

    fn release_kv(&mut self, server: usize, tokens: u64) {
        let s = &mut self.servers[server];
        s.active_kv = (s.active_kv - kv_load(tokens)).max(0.0);
    }
}

fn kv_load(tokens: u64) -> f64 {
    KV_LOAD_PER_TOKEN * tokens as f64 + KV_LOAD_BASE
}

/// The proxy in front of prefill and decode instances.
#[derive(Clone, Debug)]
pub struct Proxy {
    pub prefill: Balancer,
    pub decode: Balancer,
}

impl Proxy {
    pub fn new(
        prefill_policy: Policy,
        prefill: usize,
        decode_policy: Policy,
        decode: usize,
    ) -> Self {
        Proxy {
            prefill: Balancer::new(prefill_policy, prefill),
            decode: Balancer::new(decode_policy, decode),
        }
    }

    /// Chooses the prefill instance for a prompt of `prompt` tokens.
    pub fn route_prefill(&mut self, prompt: u64, hashes: &[u64]) -> usize {
        self.prefill.pick(prompt, hashes, true)
    }

    /// The prefill finished on `server`: its tokens are no longer active there.
    pub fn prefill_done(&mut self, server: usize, prompt: u64) {
        self.prefill.release_tokens(server, prompt);
    }

    /// Chooses the decode instance for a request whose prompt was `prompt` tokens.
    pub fn route_decode(&mut self, prompt: u64) -> usize {
        self.decode.pick(prompt, &[], false)
    }

    /// Decode started streaming: the prefill side's KV load for this request is released.
    pub fn decode_started(&mut self, prefill_server: usize, prompt: u64) {
        self.prefill.release_kv(prefill_server, prompt);
    }

    /// The request finished on decode `server`.
    pub fn decode_done(&mut self, server: usize, prompt: u64) {
        self.decode.release_tokens(server, prompt);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_balance_sends_to_the_least_loaded_and_releases() {
        let mut p = Proxy::new(Policy::LoadBalance, 2, Policy::LoadBalance, 2);
        assert_eq!(p.route_prefill(4000, &[]), 0);
        assert_eq!(p.route_prefill(100, &[]), 1);
        // Server 1 carries less: the next one goes there too.
        assert_eq!(p.route_prefill(100, &[]), 1);
        p.prefill_done(0, 4000);
        // Server 0's tokens are gone but its KV load stays until decode starts.
        assert_eq!(p.route_prefill(10, &[]), 0);
        assert_eq!(p.route_decode(500), 0);
        assert_eq!(p.route_decode(500), 1);
        p.decode_done(0, 500);
        assert_eq!(p.route_decode(10), 0);
    }

    #[test]
    fn round_robin_cycles() {
        let mut b = Balancer::new(Policy::RoundRobin, 3);
        let picks: Vec<_> = (0..6).map(|_| b.pick(1, &[], false)).collect();
        assert_eq!(picks, vec![0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn prefix_aware_follows_shared_prefixes() {
        let mut b = Balancer::new(Policy::PrefixAware, 3);
        let first = b.pick(1000, &[1, 2, 3], true);
        // Load elsewhere is lower, but the prefix lives on `first`.
        assert_eq!(b.pick(1000, &[1, 2, 9], true), first);
        // No shared prefix: least loaded.
        assert_ne!(b.pick(10, &[7, 8], true), first);
        // Only a shared first block out of four: load decides.
        assert_ne!(b.pick(10, &[1, 20, 21, 22], true), first);
    }
}
