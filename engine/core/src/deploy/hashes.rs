//! Content hashes of requests' tokens: the prompt hashes a request arrives with or that are
//! computed from its token ids, those the proxy routes on, and the keys that stand for tokens a
//! request produced when it comes back.

use super::Req;
use crate::device::ReqId;
use crate::instance::kv::chain;

/// Routed requests per chunk of a prompt's token ids when the proxy hashes them.
pub(super) const ROUTE_HASH_TOKENS: u32 = 128;

/// Salt of the hash keys that stand for tokens a request produced when their ids are unknown.
const PRODUCED_SALT: u64 = 0x6f75_7470_7574_0000;

/// A request that comes back with the tokens it produced appended to its prompt (sent back, or
/// preempted) hashes them too, as an engine hashes every full block of what it computes: from
/// the token ids when known, otherwise with keys unique to the request (produced text is shared
/// with no other request).
pub(super) fn extend_hashes(id: ReqId, r: &mut Req, token_hash_block: u32) {
    let known = r.prompt + r.emitted;
    if r.hashes.is_empty() || r.hash_block_tokens == 0 || r.emitted == 0 {
        return;
    }
    if r.tokens.len() >= known as usize && r.hash_block_tokens == token_hash_block {
        r.hashes = token_hashes(&r.tokens[..known as usize], token_hash_block);
        return;
    }
    let need = known.div_ceil(r.hash_block_tokens) as usize;
    while r.hashes.len() < need {
        let k = r.hashes.len() as u64;
        r.hashes.push(chain(PRODUCED_SALT ^ id, k));
    }
}

/// Content hashes of a token sequence's full chunks of `chunk` tokens (chained into block
/// hashes by the schedulers).
pub fn token_hashes(ids: &[u32], chunk: u32) -> Vec<u64> {
    if chunk == 0 {
        return Vec::new();
    }
    ids.chunks_exact(chunk as usize)
        .map(|c| {
            c.iter()
                .fold(0x51_7cc1_b727_220a, |h, &t| chain(h, t as u64))
        })
        .collect()
}
