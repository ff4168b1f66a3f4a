//! Arrival processes: when the requests of an open-loop synthetic workload arrive.

use crate::error::{positive_finite, TraceError};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Exp, Gamma};

const NS_PER_S: f64 = 1e9;

/// A validated arrival process. The first request arrives at t = 0; each later one after a gap
/// drawn from the process (rounded to the nanosecond).
#[derive(Clone, Debug, PartialEq)]
pub struct ArrivalProcess {
    gaps: Gaps,
}

#[derive(Clone, Debug, PartialEq)]
enum Gaps {
    Exponential(Exp<f64>),
    Gamma(Gamma<f64>),
    Zero,
}

impl ArrivalProcess {
    /// Poisson arrivals at `rate` requests per second (> 0): exponential gaps of mean `1 / rate`.
    pub fn poisson(rate: f64) -> Result<ArrivalProcess, TraceError> {
        positive_finite("rate", rate)?;
        let exp = Exp::new(rate).expect("rate finite and > 0");
        Ok(ArrivalProcess {
            gaps: Gaps::Exponential(exp),
        })
    }

    /// Gamma-distributed gaps with mean `1 / rate` and coefficient of variation `cv` (> 0):
    /// shape `1 / cv^2`, scale `cv^2 / rate`. `cv = 1` is Poisson; `cv > 1` is burstier,
    /// `cv < 1` more regular.
    pub fn gamma(rate: f64, cv: f64) -> Result<ArrivalProcess, TraceError> {
        positive_finite("rate", rate)?;
        positive_finite("cv", cv)?;
        let shape = 1.0 / (cv * cv);
        let scale = cv * cv / rate;
        let gamma = Gamma::new(shape, scale).map_err(|e| {
            TraceError::invalid(
                "cv",
                cv,
                format!("gives no usable gamma distribution ({e})"),
            )
        })?;
        Ok(ArrivalProcess {
            gaps: Gaps::Gamma(gamma),
        })
    }

    /// Every request arrives at t = 0 (a burst: the scheduler sees the whole queue at once).
    pub fn all_at_once() -> ArrivalProcess {
        ArrivalProcess { gaps: Gaps::Zero }
    }

    /// True when all requests arrive at t = 0, so a duration cannot bound their number.
    pub fn is_all_at_once(&self) -> bool {
        self.gaps == Gaps::Zero
    }

    /// Arrival times in nanoseconds, non-decreasing, starting at 0, drawn from `rng`.
    pub(crate) fn arrivals(&self, rng: ChaCha8Rng) -> Arrivals {
        Arrivals {
            process: self.clone(),
            rng,
            next_ns: 0,
        }
    }

    fn gap_ns(&self, rng: &mut ChaCha8Rng) -> u64 {
        let seconds = match &self.gaps {
            Gaps::Exponential(d) => d.sample(rng),
            Gaps::Gamma(d) => d.sample(rng),
            Gaps::Zero => return 0,
        };
        // `as` saturates: an absurdly long gap lands at the end of the clock, still in order.
        (seconds * NS_PER_S).round() as u64
    }
}

/// Endless iterator over arrival times of one process, ns from the first (at 0).
#[derive(Debug)]
pub struct Arrivals {
    process: ArrivalProcess,
    rng: ChaCha8Rng,
    next_ns: u64,
}

impl Iterator for Arrivals {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        let now = self.next_ns;
        self.next_ns = now.saturating_add(self.process.gap_ns(&mut self.rng));
        Some(now)
    }
}
