//! The twin's price cache: the price of a DP rank's step, memoized. One contract: a price is a
//! function of its key ([`PriceKey`]: the rank's quantized shape and the step's load) and of the
//! pricer's spec alone, so a price computed once is the price everywhere after, whichever rank,
//! step or instance of the same setup asks, and a cached copy never goes stale.
//!
//! A [`StepPricer`] prices one instance's steps ([`StepPricer::step`] locks the shared prices for
//! one step's lookups); instances of one setup share its `PriceTable` ([`StepPricer::share`]).
//! What is cached, fastest first: the price a rank had last (`Recent`), this pricer's copies of
//! the prices it looked up last (`Near`), the shared map of prices, and, below it, each price's
//! two parts (the batch part under the rank's shape, the MoE part under the load and the rank's
//! tokens), priced apart and combined by the step's rules ([`on_path`]). Only a new part prices an
//! op list. The misses of one step's ranks are looked up together, their slots prefetched
//! (docs/performance.md, "Design notes").

use crate::keymap::KeyMap;
pub use crate::pricekey::StepLoad;
use crate::pricekey::{slot_of, DecodeWord, PriceKey};
use crate::pricing::{
    on_path, price_memo, price_step, price_sums, two_microbatch_time, OpMemo, PathOp, PathSums,
    StepCost, StepSums,
};
use dstwin_core::batch::BatchShape;
use dstwin_core::device::{ClassTimes, CLASS_SLOTS};
use dstwin_core::features::Resolved;
use dstwin_core::layout::Plan;
use dstwin_core::model::{ModelConfig, Quant};
use dstwin_core::opgraph::{
    every_die_load, expert_reads, moe_reads, step_ops_into, step_part_ops_into, MoeLoad, Op, Part,
    StepSpec,
};
use dstwin_hwmodels::{CostModel, DType};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

fn half(s: &BatchShape) -> BatchShape {
    BatchShape {
        prefill_seqs: s.prefill_seqs.div_ceil(2),
        prefill_tokens: s.prefill_tokens.div_ceil(2),
        prefill_pairs: s.prefill_pairs.div_ceil(2),
        prefill_pairs_capped: s.prefill_pairs_capped.div_ceil(2),
        prefill_cached: s.prefill_cached.div_ceil(2),
        decode_seqs: s.decode_seqs.div_ceil(2),
        decode_tokens: s.decode_tokens.div_ceil(2),
        decode_pairs: s.decode_pairs.div_ceil(2),
        decode_pairs_capped: s.decode_pairs_capped.div_ceil(2),
    }
}

/// The price of one rank's step: its time, and where the cache keeps its time by op class
/// ([`PricerStep::class_times`]; only the slowest rank's are read).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RankCost {
    pub time_s: f64,
    at: u32,
}

/// Seconds by op class on `c`'s critical path, scaled to a step of `time_s` (a split step, or
/// one with the shared expert hidden, takes less than its serial path).
fn class_times(c: &StepCost<PathOp>, time_s: f64) -> ClassTimes {
    let scale = time_s / c.serial_s.max(f64::MIN_POSITIVE);
    let mut t = [0.0; CLASS_SLOTS];
    for o in c.on_path() {
        t[o.slot as usize] += o.total_s * scale;
    }
    t
}

/// Everything that fixes an instance's step prices besides the batch.
#[derive(Clone, Debug)]
pub struct PricerSpec {
    pub model: ModelConfig,
    pub quant: Quant,
    pub kv_dtype: DType,
    pub plan: Plan,
    pub mtp_tokens: u32,
    /// The instance's engine mechanisms, resolved.
    pub features: Resolved,
    pub cost: CostModel,
}

impl PricerSpec {
    fn step_spec(&self) -> StepSpec<'_> {
        StepSpec {
            model: &self.model,
            quant: self.quant,
            kv_dtype: self.kv_dtype,
            plan: &self.plan,
            mtp_tokens: self.mtp_tokens,
            features: &self.features,
        }
    }
}

/// Where a pricer prices one part's op list at a time (of a whole batch, or a half): the
/// list's storage and the memo of its ops' last prices, both kept between misses.
#[derive(Clone, Debug, Default)]
struct Lane {
    ops: Vec<Op>,
    memo: OpMemo,
}

impl Lane {
    /// A rank's step computing `shape` under the step's `load`, its whole op list priced.
    fn step(&mut self, spec: &PricerSpec, shape: &BatchShape, load: &MoeLoad) -> StepCost<PathOp> {
        step_ops_into(spec.step_spec(), shape, load, &mut self.ops);
        price_memo(&self.ops, &spec.cost, &mut self.memo)
    }

    /// The `part` of a rank's step computing `shape` under the step's `load`, priced.
    fn sums(
        &mut self,
        spec: &PricerSpec,
        shape: &BatchShape,
        load: &MoeLoad,
        part: Part,
    ) -> StepSums {
        step_part_ops_into(spec.step_spec(), shape, load, part, &mut self.ops);
        price_sums(&self.ops, &spec.cost, &mut self.memo)
    }
}

/// Lanes of a price table: the batch part of a whole batch and of a half, the MoE part of
/// each, and whole steps (for times by op class).
const BATCH: usize = 0;
const BATCH_HALF: usize = 1;
const MOE: usize = 2;
const MOE_HALF: usize = 3;
const WHOLE: usize = 4;

/// What fixes one die set's share of a step's MoE part, as four words: for the ops on every
/// die, what they read of the batch ([`moe_reads`]) and of the load ([`every_die_load`]); for
/// the ops on the expert dies, the load and [`expert_reads`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct MoeKey([u64; 4]);

impl MoeKey {
    /// No load gives it (a communication mode's code is below 3).
    const NONE: MoeKey = MoeKey([0, 3, 0, 0]);

    /// The keys of the every-die ops and of the expert-die ops of a rank computing `shape`
    /// under `load`.
    fn of(spec: &StepSpec<'_>, shape: &BatchShape, load: &MoeLoad) -> (MoeKey, MoeKey) {
        let comm = load.comm as u64;
        let (tokens, seqs) = moe_reads(spec, shape);
        let every = every_die_load(load);
        let (et, es) = expert_reads(spec, shape);
        (
            MoeKey([
                tokens,
                seqs << 2 | comm,
                every.imbalance.to_bits(),
                every.group_tokens,
            ]),
            MoeKey([
                et,
                es << 2 | comm,
                load.imbalance.to_bits(),
                load.group_tokens,
            ]),
        )
    }
}

/// Slots of a price table's MoE part tables (powers of two): the every-die ops' and the expert
/// dies'.
const EVERY_SLOTS: usize = 4096;
const EXPERT_SLOTS: usize = 256;

/// The MoE parts a price table priced last, one per slot by a hash of the key, the newest in
/// each, apart by die set: the every-die ops' sums, and the expert dies' (routed, shared).
///
/// The two move with different things. The EP group's tokens change most steps, and with them
/// the expert dies' ops, the same for all of a step's ranks; the every-die ops read the
/// rank's tokens, the imbalance and the communication mode, which a decode step's ranks
/// revisit. Kept together, every new group size priced the whole MoE part again for each
/// token count among the ranks (287 K MoE parts over the CloudMatrix384 hour, 13 per decode
/// step); apart, a new group size prices the expert dies' part once. Kept for good they took
/// 90 MB on that hour (91 K keys), and a part is cheap to price again.
#[derive(Debug)]
struct MoeParts {
    every: Box<[(MoeKey, PathSums)]>,
    experts: Box<[(MoeKey, [PathSums; 2])]>,
}

impl Default for MoeParts {
    fn default() -> Self {
        MoeParts {
            every: vec![(MoeKey::NONE, PathSums::default()); EVERY_SLOTS].into_boxed_slice(),
            experts: vec![(MoeKey::NONE, [PathSums::default(); 2]); EXPERT_SLOTS]
                .into_boxed_slice(),
        }
    }
}

impl MoeParts {
    /// The MoE part's sums by die set ([`on_path`]'s order) in `every` and `experts` slots.
    fn sums(&self, (every, experts): (usize, usize)) -> [&PathSums; 3] {
        let [routed, shared] = &self.experts[experts].1;
        [&self.every[every].1, routed, shared]
    }
}

/// The prices of one pricer spec. Every device built from the same `[[instance]]` setup
/// shares one table: the instances of a setup price the same shapes alike (a price is a
/// function of its key alone), and a shape one instance priced is a hit for the others.
///
/// A price is made of two parts priced apart ([`Part`]), each cached under what fixes it: the
/// batch part under the rank's quantized shape, the MoE part under the step's load and the
/// rank's tokens. A step's rules read only the parts' sums ([`on_path`]), so a new pairing of
/// a shape and a load costs two lookups and the rules, not an op list priced. (On the
/// CloudMatrix384 hour the prefill ranks priced 296 K keys from about 60 K shapes and a few
/// hundred loads.)
#[derive(Debug, Default)]
struct PriceTable {
    /// Prices by key: a step's lookups are prefetched ([`KeyMap`]).
    cache: KeyMap<RankCost>,
    /// Each cached price's key and where its time by op class is (`RankCost::at`), once
    /// computed: only the slowest rank's are read, from the whole step's op list.
    priced: Vec<(PriceKey, u32)>,
    classes: Vec<ClassTimes>,
    /// Batch parts by their shape's key ([`PriceKey::batch`]): where in `batch_sums` the whole
    /// batch's are, and the half's (`NO_HALF` where the mechanisms never split the batch).
    batches: KeyMap<(u32, u32)>,
    batch_sums: Vec<PathSums>,
    moes: MoeParts,
    lanes: [Lane; 5],
}

/// `PriceTable::batches`: a batch the mechanisms never split.
const NO_HALF: u32 = u32::MAX;

impl PriceTable {
    /// The batch part of a rank computing `shape` (its price key `key`): where its whole and
    /// half sums are. The half is priced where the mechanisms allow a split (a function of the
    /// shape).
    fn batch_part(
        &mut self,
        spec: &PricerSpec,
        key: PriceKey,
        shape: &BatchShape,
        load: &MoeLoad,
    ) -> (u32, u32) {
        let bk = key.batch();
        if let Some(at) = self.batches.get(&bk) {
            return at;
        }
        // The batch part does not read the load.
        let whole = self.lanes[BATCH].sums(spec, shape, load, Part::Batch).batch;
        self.batch_sums.push(whole);
        let at_whole = self.batch_sums.len() as u32 - 1;
        let f = &spec.features;
        let at_half = if f.two_microbatch_allowed(shape.tokens(), shape.prefill_tokens > 0) {
            let h = self.lanes[BATCH_HALF].sums(spec, &half(shape), load, Part::Batch);
            self.batch_sums.push(h.batch);
            self.batch_sums.len() as u32 - 1
        } else {
            NO_HALF
        };
        self.batches.insert(bk, (at_whole, at_half));
        (at_whole, at_half)
    }

    /// Asks for the sums of the batch part of `key` (its whole and half batch), if they are
    /// cached: a hint before the price of `key` is computed. (Asking for its MoE parts' slots
    /// too cost more than it saved: the keys are computed from the price key's shape.)
    fn prefetch_batch_sums(&self, key: &PriceKey) {
        if let Some((whole, half)) = self.batches.get(&key.batch()) {
            for at in [whole, half] {
                if let Some(sums) = self.batch_sums.get(at as usize) {
                    dstwin_prefetch::value(sums);
                }
            }
        }
    }

    /// The MoE part of a rank computing `shape` under `load` (priced in `lane` where new):
    /// where in `moes` its sums by die set are ([`MoeParts::sums`]).
    fn moe_part(
        &mut self,
        spec: &PricerSpec,
        shape: &BatchShape,
        load: &MoeLoad,
        lane: usize,
    ) -> (usize, usize) {
        let (every, experts) = MoeKey::of(&spec.step_spec(), shape, load);
        let (e, x) = (
            slot_of::<EVERY_SLOTS>(&every.0),
            slot_of::<EXPERT_SLOTS>(&experts.0),
        );
        let m = &mut self.moes;
        if m.every[e].0 != every || m.experts[x].0 != experts {
            // Each die set's ops are summed apart, so a part priced whole gives both.
            let [a, r, s] = self.lanes[lane].sums(spec, shape, load, Part::Moe).moe;
            m.every[e] = (every, a);
            m.experts[x] = (experts, [r, s]);
        }
        (e, x)
    }

    /// The step's time for `key` (the quantized shape and load it stands for) under the
    /// instance's mechanisms ([`price_step`]), from its parts.
    fn time(&mut self, spec: &PricerSpec, key: PriceKey) -> f64 {
        let (shape, load) = key.shape();
        let (whole, at_half) = self.batch_part(spec, key, &shape, &load);
        let moe = self.moe_part(spec, &shape, &load, MOE);
        let (_, full) = on_path(&self.batch_sums[whole as usize], self.moes.sums(moe));
        let split = || {
            // Two micro-batches of half the batch each, half the EP group's tokens too.
            let half_load = MoeLoad {
                group_tokens: load.group_tokens.div_ceil(2),
                ..load
            };
            let moe = self.moe_part(spec, &half(&shape), &half_load, MOE_HALF);
            let (_, h) = on_path(&self.batch_sums[at_half as usize], self.moes.sums(moe));
            two_microbatch_time(&h, &spec.cost.params)
        };
        let draft_launch_s = crate::pricing::draft_launch_s(
            &spec.cost,
            &spec.model,
            spec.mtp_tokens,
            &spec.features,
        );
        price_step(&spec.features, &shape, &full, draft_launch_s, split).time_s
    }
}

/// What a pricer keeps of one DP rank: the last key it priced with its cost, and the decode
/// word its keys are read from ([`DecodeWord`]).
#[derive(Clone, Copy, Debug, Default)]
struct Recent {
    last: Option<(PriceKey, RankCost)>,
    word: DecodeWord,
}

/// Memoized per-rank step pricing. Clones (and [`StepPricer::share`]) share the prices; each
/// keeps its own ranks' last keys and its own hit counts.
#[derive(Clone, Debug)]
pub struct StepPricer {
    spec: Arc<PricerSpec>,
    table: Arc<Mutex<PriceTable>>,
    /// Per DP rank, the last key it priced and its cost, and its last decode word: a rank's
    /// quantized shape stays the same for many steps, and this small array stays in cache
    /// where the map does not.
    recent: Vec<Recent>,
    /// The prices this pricer looked up in the shared map last, by a hash of their key
    /// ([`Near`]).
    near: Box<Near>,
    /// The ranks of the step being priced whose last key did not match ([`PricerStep::add`]).
    pending: Vec<Pending>,
    /// Where among `pending` the ranks whose price is not cached are ([`PricerStep::slowest`]).
    misses_at: Vec<usize>,
    pub hits: u64,
    pub misses: u64,
}

/// A rank of the step being priced whose last key did not match: looked up after the step's
/// other ranks are added, its slot in the shared map prefetched meanwhile.
#[derive(Clone, Copy, Debug)]
struct Pending {
    /// Its place among the step's ranks, its DP rank (`NO_RANK`: the idle ranks' dummy batch)
    /// and its key.
    at: u32,
    rank: u32,
    key: PriceKey,
}

/// `Pending::rank` of the idle ranks' dummy batch, which keeps no last key.
const NO_RANK: u32 = u32::MAX;

/// Slots of a pricer's [`Near`] prices (a power of two).
const NEAR_SLOTS: usize = 256;

/// A pricer's own copy of the shared prices it looked up last, one per slot by a hash of the
/// key, the newest in each slot: 10 KB that stay in the first-level cache where the shared map
/// does not. When a step's load changes, every rank's key changes, but a large decode
/// instance's hundreds of ranks have a few dozen shapes between them: measured on the
/// CloudMatrix384 hour, a lookup past a rank's last key went to the map 4.7 M times for about
/// 45 keys per step, each lookup two cache misses (the control bytes, then the entry). A price
/// is a function of its key alone, so a copy never goes stale.
#[derive(Clone, Debug)]
struct Near([(PriceKey, RankCost); NEAR_SLOTS]);

impl Default for Near {
    fn default() -> Self {
        let none = RankCost {
            time_s: 0.0,
            at: u32::MAX,
        };
        Near([(PriceKey::NONE, none); NEAR_SLOTS])
    }
}

/// A pricer's prices locked for one step's lookups ([`StepPricer::step`]): one lock per step,
/// not per rank.
pub struct PricerStep<'a> {
    spec: &'a PricerSpec,
    table: MutexGuard<'a, PriceTable>,
    recent: &'a mut Vec<Recent>,
    near: &'a mut Near,
    pending: &'a mut Vec<Pending>,
    misses_at: &'a mut Vec<usize>,
    /// Ranks added since the last [`PricerStep::slowest`], and the slowest of those priced so
    /// far with its place.
    added: u32,
    slowest: Option<(u32, RankCost)>,
    hits: &'a mut u64,
    misses: &'a mut u64,
}

impl StepPricer {
    pub fn new(spec: PricerSpec) -> Self {
        Self::over(Arc::new(spec), Arc::default())
    }

    /// A pricer of the same spec sharing this one's prices, with its own ranks' last keys and
    /// counts: for another instance of the same setup.
    pub fn share(&self) -> Self {
        Self::over(self.spec.clone(), self.table.clone())
    }

    /// A pricer of `spec` over the prices `table`, with nothing looked up yet.
    fn over(spec: Arc<PricerSpec>, table: Arc<Mutex<PriceTable>>) -> Self {
        StepPricer {
            spec,
            table,
            recent: Vec::new(),
            near: Box::default(),
            pending: Vec::new(),
            misses_at: Vec::new(),
            hits: 0,
            misses: 0,
        }
    }

    pub fn spec(&self) -> &PricerSpec {
        &self.spec
    }

    /// Locks the shared prices for one step's lookups. A panic while the lock was held leaves
    /// at worst a priced key that no cached price points to (a price enters the map last), so
    /// a poisoned lock is taken as it is.
    pub fn step(&mut self) -> PricerStep<'_> {
        // Ranks a step added and never asked the slowest of are not this step's.
        self.pending.clear();
        PricerStep {
            spec: &self.spec,
            table: self.table.lock().unwrap_or_else(PoisonError::into_inner),
            recent: &mut self.recent,
            near: &mut self.near,
            pending: &mut self.pending,
            misses_at: &mut self.misses_at,
            added: 0,
            slowest: None,
            hits: &mut self.hits,
            misses: &mut self.misses,
        }
    }
}

impl PricerStep<'_> {
    /// The price of one rank computing `shape` under the step's `load` (nothing else added).
    pub fn rank_cost(&mut self, shape: &BatchShape, load: StepLoad) -> RankCost {
        self.add(None, shape, load);
        self.slowest().expect("one rank added")
    }

    /// [`PricerStep::rank_cost`] for DP rank `rank`, checking first what that rank priced last.
    pub fn rank_cost_of(&mut self, rank: usize, shape: &BatchShape, load: StepLoad) -> RankCost {
        self.add(Some(rank), shape, load);
        self.slowest().expect("one rank added")
    }

    /// Adds DP rank `rank` computing `shape` under the step's `load` to the ranks whose
    /// slowest [`PricerStep::slowest`] finds (`None`: the idle ranks' dummy batch). A rank
    /// whose key is the one it priced last, or whose price the pricer has a copy of ([`Near`]),
    /// is priced at once; the others wait, their slots in the shared map prefetched, so that
    /// their lookups wait for memory together rather than one after another.
    ///
    /// The common case, a rank whose key is the one it priced last, is inlined into the
    /// caller's pass over the ranks; the rest is not.
    #[inline]
    pub fn add(&mut self, rank: Option<usize>, shape: &BatchShape, load: StepLoad) {
        let at = self.added;
        self.added += 1;
        let key = match rank {
            Some(r) => {
                if r >= self.recent.len() {
                    self.recent.resize(r + 1, Recent::default());
                }
                let recent = &mut self.recent[r];
                let key = recent.word.key(shape, load);
                if let Some((k, c)) = recent.last {
                    if k == key {
                        *self.hits += 1;
                        self.offer(at, c);
                        return;
                    }
                }
                key
            }
            None => PriceKey::with_load(shape, load),
        };
        self.add_key(at, rank, key);
    }

    /// [`PricerStep::add`] of a key that is not the rank's last: from this pricer's copy, or
    /// queued for [`PricerStep::slowest`].
    #[inline(never)]
    fn add_key(&mut self, at: u32, rank: Option<usize>, key: PriceKey) {
        // A copy at hand needs no prefetch (a prefetch the lookup will not use only holds up
        // those it will).
        if let Some(c) = self.near_copy(&key) {
            if let Some(r) = rank {
                self.recent[r].last = Some((key, c));
            }
            self.offer(at, c);
            return;
        }
        self.table.cache.prefetch(&key);
        self.pending.push(Pending {
            at,
            rank: rank.map_or(NO_RANK, |r| r as u32),
            key,
        });
    }

    /// The slowest price of the ranks added since the last call (the first added of equal
    /// ones), every one of them priced.
    ///
    /// Queued ranks whose price is cached are priced first. The others' prices are computed
    /// after their batch parts' slots, then the parts' sums, were asked for together: a step
    /// of new pairings of shapes and a load (a prefill step's, most steps) waits for those
    /// cache misses once, not once per rank. The prices, the counts and the slowest are what
    /// pricing the ranks one after another gives (a price is a function of its key; a key
    /// queued twice is priced once and found once).
    pub fn slowest(&mut self) -> Option<RankCost> {
        let mut pending = std::mem::take(self.pending);
        let mut misses = std::mem::take(self.misses_at);
        misses.clear();
        for (i, p) in pending.iter().enumerate() {
            match self.cached(&p.key) {
                Some(c) => self.priced_rank(p, c),
                None => {
                    self.table.batches.prefetch(&p.key.batch());
                    misses.push(i);
                }
            }
        }
        // A single miss has no other to wait beside.
        if misses.len() > 1 {
            for &i in &misses {
                self.table.prefetch_batch_sums(&pending[i].key);
            }
        }
        for &i in &misses {
            let p = pending[i];
            let c = self.cost_near(p.key);
            self.priced_rank(&p, c);
        }
        pending.clear();
        *self.pending = pending;
        *self.misses_at = misses;
        self.added = 0;
        self.slowest.take().map(|(_, c)| c)
    }

    /// Queued rank `p` costs `c`: its last key, and an offer for the slowest.
    #[inline]
    fn priced_rank(&mut self, p: &Pending, c: RankCost) {
        if p.rank != NO_RANK {
            self.recent[p.rank as usize].last = Some((p.key, c));
        }
        self.offer(p.at, c);
    }

    /// The rank added `at`th costs `c`.
    #[inline]
    fn offer(&mut self, at: u32, c: RankCost) {
        if slower_than(at, c, self.slowest) {
            self.slowest = Some((at, c));
        }
    }

    /// The price of `key`: cached ([`PricerStep::cached`]), or computed now (a miss) and kept
    /// as this pricer's copy.
    fn cost_near(&mut self, key: PriceKey) -> RankCost {
        if let Some(c) = self.cached(&key) {
            return c;
        }
        let c = self.compute(key);
        self.near.0[key.slot::<NEAR_SLOTS>()] = (key, c);
        c
    }

    /// The price of `key` where it is cached (a hit): this pricer's copy ([`Near`]), else the
    /// shared map's, which becomes this pricer's copy.
    #[inline(always)]
    fn cached(&mut self, key: &PriceKey) -> Option<RankCost> {
        if let Some(c) = self.near_copy(key) {
            return Some(c);
        }
        let c = self.table.cache.get(key)?;
        *self.hits += 1;
        self.near.0[key.slot::<NEAR_SLOTS>()] = (*key, c);
        Some(c)
    }

    /// This pricer's copy of the price of `key`, where it has one ([`Near`]).
    #[inline]
    fn near_copy(&mut self, key: &PriceKey) -> Option<RankCost> {
        let (k, c) = self.near.0[key.slot::<NEAR_SLOTS>()];
        (k == *key).then(|| {
            *self.hits += 1;
            c
        })
    }

    /// Time by op class on the critical path of a price this pricer returned.
    pub fn class_times(&mut self, c: RankCost) -> ClassTimes {
        let t = &mut *self.table;
        let (key, at) = t.priced[c.at as usize];
        if at != NOT_YET {
            return t.classes[at as usize];
        }
        let (shape, load) = key.shape();
        let times = class_times(&t.lanes[WHOLE].step(self.spec, &shape, &load), c.time_s);
        t.priced[c.at as usize].1 = t.classes.len() as u32;
        t.classes.push(times);
        times
    }

    /// Prices `key`, which no cache holds (a miss), into the shared map.
    fn compute(&mut self, key: PriceKey) -> RankCost {
        let t = &mut *self.table;
        *self.misses += 1;
        let time_s = t.time(self.spec, key);
        t.priced.push((key, NOT_YET));
        let cost = RankCost {
            time_s,
            at: t.priced.len() as u32 - 1,
        };
        t.cache.insert(key, cost);
        cost
    }
}

/// Whether the rank added `at`th, costing `c`, is slower than the slowest so far (`slowest`,
/// with its place): the first added of equal prices is the slowest, in whatever order the
/// prices come.
fn slower_than(at: u32, c: RankCost, slowest: Option<(u32, RankCost)>) -> bool {
    match slowest {
        None => true,
        Some((a, s)) => c.time_s > s.time_s || (c.time_s == s.time_s && at < a),
    }
}

/// `PriceTable::priced`: times by op class not computed yet.
const NOT_YET: u32 = u32::MAX;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slowest_is_the_first_added_of_equal_prices_in_any_order() {
        let cost = |time_s, at| RankCost { time_s, at };
        let prices = [
            (5, cost(1.0, 0)),
            (2, cost(1.0, 1)),
            (7, cost(0.5, 2)),
            (3, cost(1.0, 3)),
        ];
        // Every order of the four offers gives the one added second (place 2).
        let orders = [[0, 1, 2, 3], [3, 2, 1, 0], [1, 3, 0, 2], [2, 0, 3, 1]];
        for order in orders {
            let mut slowest = None;
            for i in order {
                let (at, c) = prices[i];
                if slower_than(at, c, slowest) {
                    slowest = Some((at, c));
                }
            }
            assert_eq!(slowest, Some(prices[1]), "{order:?}");
        }
    }
}
