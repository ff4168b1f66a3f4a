//! The timeline both drivers run the deployment core on: the simulator in virtual time and the
//! wall-clock runtime alike. The clock is the only difference between them; what this module
//! holds is written once.
//!
//! - **Events in order**: step ends, the fabric's next delivery and a driver's own events
//!   (the simulator's arrivals), keyed by (device time, sequence number), so that events of one
//!   instant are applied in the order they were queued. A step handed to a device takes its
//!   number when it starts ([`Timeline::reserve`]), so that steps ending at the same instant
//!   complete in start order whenever their ends become known.
//! - **The effect pump** ([`pump`]): the core's effects carried out through the driver (run a
//!   step, start a KV transfer), its notes handed to the driver, again while the driver gives
//!   the core new inputs; then the fabric's next delivery queued once.
//! - **The same-instant rule** ([`settle`]): the core plans an instant only once every event of
//!   that instant has been applied, so that inputs arriving together are scheduled together
//!   whatever order they were applied in.

use crate::deploy::{Deployment, Effect, Note};
use crate::device::{DeviceError, Fabric, ReqId};
use crate::time::SimTime;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// An event on the timeline: an instance's step ends, the fabric may have delivered, or one of
/// the driver's own (`E`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Event<E> {
    StepDone(u32),
    Fabric,
    Own(E),
}

/// The events to come, the current instant and the pump's buffers.
#[derive(Debug)]
pub struct Timeline<E> {
    now: SimTime,
    seq: u64,
    queue: BinaryHeap<Reverse<(SimTime, u64, Event<E>)>>,
    /// The time of the queued fabric event, if one is queued.
    fabric_armed: Option<SimTime>,
    effects: Vec<Effect>,
    notes: Vec<Note>,
}

impl<E: Ord + Copy> Default for Timeline<E> {
    fn default() -> Self {
        Timeline {
            now: SimTime::ZERO,
            seq: 0,
            queue: BinaryHeap::new(),
            fabric_armed: None,
            effects: Vec::new(),
            notes: Vec::new(),
        }
    }
}

impl<E: Ord + Copy> Timeline<E> {
    /// The current instant.
    pub fn now(&self) -> SimTime {
        self.now
    }

    /// Moves the current instant to `t`, never back: an event the wall clock has already
    /// passed is applied at the instant reached (the simulator's events never lie behind).
    pub fn advance_to(&mut self, t: SimTime) {
        self.now = self.now.max(t);
    }

    /// Queues `ev` at `t`, after everything queued before it for `t`.
    pub fn push(&mut self, t: SimTime, ev: Event<E>) {
        let seq = self.reserve();
        self.push_reserved(t, seq, ev);
    }

    /// A place in the order of events taken now, for an event whose time is known later (the
    /// end of a step a device is still running).
    pub fn reserve(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Queues `ev` at `t` in the place `seq` reserved.
    pub fn push_reserved(&mut self, t: SimTime, seq: u64, ev: Event<E>) {
        self.queue.push(Reverse((t, seq, ev)));
    }

    /// The time of the next event, if any.
    pub fn next_time(&self) -> Option<SimTime> {
        self.queue.peek().map(|Reverse((t, _, _))| *t)
    }

    /// Takes the next event and moves the current instant to it (the fabric's event disarms
    /// it: the pump queues the next one).
    pub fn pop(&mut self) -> Option<Event<E>> {
        let Reverse((t, _, ev)) = self.queue.pop()?;
        self.advance_to(t);
        if ev == Event::Fabric {
            self.fabric_armed = None;
        }
        Some(ev)
    }

    /// Whether every event of the current instant has been applied.
    pub fn instant_over(&self) -> bool {
        self.next_time().is_none_or(|t| t > self.now)
    }
}

/// A driver as the pump sees it: where the timeline, the core and the fabric are, and what it
/// does with the core's effects and notes.
pub trait Driver<E> {
    type Error;
    /// The timeline, the core and the fabric the pump works on.
    fn parts(&mut self) -> (&mut Timeline<E>, &mut Deployment, &mut dyn Fabric);
    /// Runs instance `inst`'s planned step from now, or hands it to its device.
    fn execute(&mut self, inst: usize) -> Result<(), Self::Error>;
    /// The fabric refused to start request `req`'s KV transfer.
    fn transfer_failed(&mut self, req: ReqId, e: DeviceError) -> Result<(), Self::Error>;
    /// Handles the core's notes, in order (the vector is cleared after); true when that gave
    /// the core new inputs (a closed loop refilling what left), whose effects and notes the
    /// pump then carries out too.
    fn notes(&mut self, notes: &mut Vec<Note>) -> Result<bool, Self::Error>;
}

/// Carries out the core's effects and hands its notes to the driver, until the driver gives
/// the core no new input; then queues the fabric's next delivery, unless an earlier one is
/// queued.
pub fn pump<E: Ord + Copy, D: Driver<E>>(d: &mut D) -> Result<(), D::Error> {
    loop {
        let (tl, core, _) = d.parts();
        core.take_effects(&mut tl.effects);
        let mut effects = std::mem::take(&mut tl.effects);
        for e in effects.drain(..) {
            match e {
                Effect::Execute { inst } => d.execute(inst as usize)?,
                Effect::Transfer(x) => {
                    let (tl, _, fabric) = d.parts();
                    if let Err(err) = fabric.start(tl.now, &x) {
                        d.transfer_failed(x.req, err)?;
                    }
                }
            }
        }
        let (tl, core, _) = d.parts();
        tl.effects = effects;
        core.take_notes(&mut tl.notes);
        let mut notes = std::mem::take(&mut tl.notes);
        let again = d.notes(&mut notes);
        notes.clear();
        d.parts().0.notes = notes;
        if !again? {
            break;
        }
    }
    let (tl, _, fabric) = d.parts();
    if let Some(t) = fabric.next_event() {
        if tl.fabric_armed.is_none_or(|a| t < a) {
            tl.fabric_armed = Some(t);
            tl.push(t, Event::Fabric);
        }
    }
    Ok(())
}

/// The core plans the current instant and the pump carries out its plans.
pub fn plan<E: Ord + Copy, D: Driver<E>>(d: &mut D) -> Result<(), D::Error> {
    let (tl, core, _) = d.parts();
    core.plan_steps(tl.now);
    pump(d)
}

/// The same-instant rule: [`plan`] once no event is left at the current instant; whether it
/// planned (the instant is over).
pub fn settle<E: Ord + Copy, D: Driver<E>>(d: &mut D) -> Result<bool, D::Error> {
    let over = d.parts().0.instant_over();
    if over {
        plan(d)?;
    }
    Ok(over)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_of_an_instant_come_in_the_order_they_took_their_places() {
        let mut tl = Timeline::<u8>::default();
        let t = SimTime(5);
        let early = tl.reserve();
        tl.push(t, Event::Own(1));
        tl.push(SimTime(3), Event::Own(2));
        // The step that started first ends at the same instant: it comes first.
        tl.push_reserved(t, early, Event::StepDone(0));
        assert_eq!(tl.pop(), Some(Event::Own(2)));
        assert_eq!(tl.now(), SimTime(3));
        assert!(tl.instant_over());
        assert_eq!(tl.pop(), Some(Event::StepDone(0)));
        assert!(!tl.instant_over(), "another event at 5");
        assert_eq!(tl.pop(), Some(Event::Own(1)));
        assert!(tl.instant_over());
        assert_eq!(tl.pop(), None);
    }

    #[test]
    fn the_fabric_event_disarms_when_it_fires() {
        let mut tl = Timeline::<u8> {
            fabric_armed: Some(SimTime(9)),
            ..Timeline::default()
        };
        tl.push(SimTime(9), Event::Fabric);
        assert_eq!(tl.pop(), Some(Event::Fabric));
        assert_eq!(tl.fabric_armed, None, "disarmed when it fires");
    }
}
