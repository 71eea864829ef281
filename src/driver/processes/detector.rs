//! An adaptive heartbeat failure detector: phi accrual (Hayashibara,
//! Défago, Yared and Katayama, "The φ accrual failure detector", SRDS
//! 2004), in the form Akka and Cassandra use.
//!
//! A fixed timeout cries wolf on a loaded machine: a rank descheduled for a
//! few hundred milliseconds looks exactly like a dead one. Phi accrual
//! keeps the recent heartbeat intervals of each peer and turns a silence
//! into a suspicion level, φ = −log₁₀ P(a live peer is silent this long),
//! from their mean and standard deviation, so the timeout grows with the
//! jitter it observes. Here a peer is suspected when φ reaches
//! [`PHI_THRESHOLD`] and the silence reaches the configured minimum
//! (`--heartbeat-timeout`); it is declared dead only when the silence
//! doubles past the moment of suspicion, so a late heartbeat in between
//! ends the suspicion, which is counted as a false one.
//!
//! The detector is a pure state machine: it owns no clock, the launcher
//! feeds it arrival times (time since the launcher started) and asks for a
//! verdict at its checks, which makes it testable with scripted times.

use std::collections::VecDeque;
use std::time::Duration;

/// The φ at which a peer is suspected (Akka's default: a live peer with the
/// observed heartbeat statistics is this silent with probability 10⁻⁸).
pub const PHI_THRESHOLD: f64 = 8.0;

/// How many recent heartbeat intervals the statistics cover (at the
/// heartbeat period of a quarter of the 200 ms default timeout, the last
/// 5 s: long enough to see a load's jitter, short enough to follow it).
const WINDOW: usize = 100;

/// A peer's standing at a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Heard from recently enough.
    Trusted,
    /// Silent for longer than a live peer is likely to be, since this
    /// check (the suspicion is new).
    NewSuspicion,
    /// Still suspected, not yet declared dead.
    Suspected,
    /// Suspected and silent for twice as long as when the suspicion began:
    /// declare it dead.
    Dead,
}

/// The heartbeat history and suspicion state of one monitored peer.
#[derive(Debug, Clone)]
pub struct PhiAccrual {
    /// Recent intervals between heartbeats, seconds.
    intervals: VecDeque<f64>,
    /// Their sum and sum of squares (kept as the window slides).
    sum: f64,
    sum_sq: f64,
    /// When the last heartbeat arrived (intervals are measured between
    /// heartbeats only; other signs of life come in bursts).
    last_beat: Option<Duration>,
    /// When the peer last showed it was alive (a heartbeat, any message,
    /// bytes of a message still arriving).
    last_sign: Duration,
    /// No suspicion before this much silence (`--heartbeat-timeout`).
    min_timeout: Duration,
    /// Floor of the standard deviation, seconds: perfectly regular
    /// heartbeats would otherwise make the smallest delay look fatal.
    min_sd: f64,
    /// The silence at which the current suspicion began.
    suspected: Option<Duration>,
}

impl PhiAccrual {
    /// Watch a peer that heartbeats about every `period`, first heard of
    /// (connected) at `now`; a silence shorter than `min_timeout` is never
    /// suspected.
    pub fn new(period: Duration, min_timeout: Duration, now: Duration) -> Self {
        let p = period.as_secs_f64();
        let mut d = PhiAccrual {
            intervals: VecDeque::with_capacity(WINDOW),
            sum: 0.0,
            sum_sq: 0.0,
            last_beat: None,
            last_sign: now,
            min_timeout,
            min_sd: p / 4.0,
            suspected: None,
        };
        // Before any interval is seen, assume the nominal period with a
        // quarter of it as deviation (as Akka's first-heartbeat estimate).
        d.sample(p - p / 4.0);
        d.sample(p + p / 4.0);
        d
    }

    fn sample(&mut self, interval: f64) {
        if self.intervals.len() == WINDOW
            && let Some(old) = self.intervals.pop_front()
        {
            self.sum -= old;
            self.sum_sq -= old * old;
        }
        self.intervals.push_back(interval);
        self.sum += interval;
        self.sum_sq += interval * interval;
    }

    /// A heartbeat arrived at `at`. Returns whether it ended a suspicion
    /// (the suspicion was false).
    pub fn heartbeat(&mut self, at: Duration) -> bool {
        if let Some(prev) = self.last_beat {
            self.sample(at.saturating_sub(prev).as_secs_f64());
        }
        self.last_beat = Some(at);
        self.sign_of_life(at)
    }

    /// The peer showed at `at` that it is alive (a message other than a
    /// heartbeat, or bytes of one arriving). Returns whether that ended a
    /// suspicion (the suspicion was false). A sign no newer than the last
    /// one known tells nothing (the launcher reports the newest bytes at
    /// every check).
    pub fn sign_of_life(&mut self, at: Duration) -> bool {
        if at <= self.last_sign {
            return false;
        }
        self.last_sign = at;
        self.suspected.take().is_some()
    }

    /// The observer itself was held up (a late check of a stalled
    /// launcher): heartbeats may sit unread in its sockets, so no silence
    /// before `now - grace` is held against the peer.
    pub fn excuse(&mut self, now: Duration, grace: Duration) {
        let from = now.saturating_sub(grace);
        if from > self.last_sign {
            self.last_sign = from;
        }
    }

    /// When the peer last showed it was alive (or the end of an excused
    /// stall).
    pub fn last_sign(&self) -> Duration {
        self.last_sign
    }

    /// How long the peer has been silent at `now`.
    pub fn silence(&self, now: Duration) -> Duration {
        now.saturating_sub(self.last_sign)
    }

    /// The suspicion level at `now`: −log₁₀ of the probability that a live
    /// peer with the observed intervals stays silent this long (normal
    /// distribution, with Akka's logistic approximation of its tail).
    pub fn phi(&self, now: Duration) -> f64 {
        let n = self.intervals.len().max(1) as f64;
        let mean = self.sum / n;
        let var = (self.sum_sq / n - mean * mean).max(0.0);
        let sd = var.sqrt().max(self.min_sd);
        let y = (self.silence(now).as_secs_f64() - mean) / sd;
        let e = (-y * (1.5976 + 0.070566 * y * y)).exp();
        if y > 0.0 {
            -(e / (1.0 + e)).log10()
        } else {
            -(1.0 - 1.0 / (1.0 + e)).log10()
        }
    }

    /// The peer's standing at `now`, which moves the suspicion state on.
    pub fn check(&mut self, now: Duration) -> Verdict {
        let silence = self.silence(now);
        match self.suspected {
            Some(at) if silence >= at * 2 => Verdict::Dead,
            Some(_) => Verdict::Suspected,
            None if silence >= self.min_timeout && self.phi(now) >= PHI_THRESHOLD => {
                self.suspected = Some(silence);
                Verdict::NewSuspicion
            }
            None => Verdict::Trusted,
        }
    }

    /// Whether the peer is suspected now (as of the last check).
    pub fn is_suspected(&self) -> bool {
        self.suspected.is_some()
    }

    /// The silence at which the current suspicion began (`None` when the
    /// peer is not suspected): it is declared dead at twice that.
    pub fn suspected_after(&self) -> Option<Duration> {
        self.suspected
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A detector for a 50 ms period with a 200 ms minimum, fed heartbeats
    /// at the given intervals from t = 0; returns it and the last arrival.
    fn fed(intervals: impl IntoIterator<Item = u64>) -> (PhiAccrual, Duration) {
        let mut d = PhiAccrual::new(ms(50), ms(200), ms(0));
        let mut t = ms(0);
        d.heartbeat(t);
        for i in intervals {
            t += ms(i);
            assert!(!d.heartbeat(t));
            assert_eq!(d.check(t), Verdict::Trusted);
        }
        (d, t)
    }

    /// The first silence (in 1 ms steps after `from`) at which the detector
    /// suspects, checked every millisecond.
    fn suspicion_after(d: &mut PhiAccrual, from: Duration) -> Duration {
        (1..100_000)
            .map(ms)
            .find(|&s| d.check(from + s) == Verdict::NewSuspicion)
            .expect("a silent peer is suspected")
    }

    #[test]
    fn regular_heartbeats_are_never_suspected() {
        let (mut d, t) = fed([50; 500]);
        assert!(d.phi(t) < 1.0);
        assert_eq!(d.check(t + ms(150)), Verdict::Trusted);
        assert!(!d.is_suspected());
    }

    #[test]
    fn phi_grows_with_silence() {
        let (d, t) = fed([50; 50]);
        let phis: Vec<f64> = (0..20).map(|i| d.phi(t + ms(20 * i))).collect();
        assert!(phis.windows(2).all(|w| w[0] <= w[1]), "{phis:?}");
        assert!(phis[19] > PHI_THRESHOLD);
    }

    /// Under regular heartbeats the minimum timeout decides; a silence
    /// twice as long as at suspicion is death.
    #[test]
    fn a_silent_peer_is_suspected_at_the_minimum_then_declared_dead() {
        let (mut d, t) = fed([50; 100]);
        let s = suspicion_after(&mut d, t);
        assert_eq!(s, ms(200));
        assert!(d.is_suspected());
        assert_eq!(d.check(t + ms(300)), Verdict::Suspected);
        assert_eq!(d.check(t + ms(399)), Verdict::Suspected);
        assert_eq!(d.check(t + ms(400)), Verdict::Dead);
    }

    /// Jittery heartbeats (a loaded machine) push the timeout far past the
    /// minimum: the detector adapts, a fixed 200 ms timeout would not.
    #[test]
    fn jitter_lengthens_the_timeout() {
        let jitter = (0..200).map(|i| if i % 4 == 0 { 400 } else { 20 });
        let (mut d, t) = fed(jitter);
        assert_eq!(d.check(t + ms(450)), Verdict::Trusted);
        let s = suspicion_after(&mut d, t);
        assert!(s > ms(900), "suspected after {s:?}");
    }

    /// A suspected peer that heartbeats again was falsely suspected: the
    /// heartbeat says so once, and it is trusted again.
    #[test]
    fn a_heartbeat_ends_a_suspicion_and_reports_it_false() {
        let (mut d, t) = fed([50; 100]);
        let s = suspicion_after(&mut d, t);
        assert!(d.heartbeat(t + s + ms(10)));
        assert!(!d.is_suspected());
        assert_eq!(d.check(t + s + ms(20)), Verdict::Trusted);
        assert!(!d.heartbeat(t + s + ms(60)));
    }

    /// Other signs of life end a suspicion too, without entering the
    /// interval statistics.
    #[test]
    fn a_sign_of_life_ends_a_suspicion_without_a_sample() {
        let (mut d, t) = fed([50; 100]);
        let before = (d.sum, d.intervals.len());
        let s = suspicion_after(&mut d, t);
        assert!(!d.sign_of_life(t), "an old sign tells nothing");
        assert!(d.is_suspected());
        assert!(d.sign_of_life(t + s));
        assert_eq!((d.sum, d.intervals.len()), before);
        assert_eq!(d.check(t + s + ms(100)), Verdict::Trusted);
    }

    /// A stalled observer excuses the silence before its stall.
    #[test]
    fn an_excused_stall_does_not_count_as_silence() {
        let (mut d, t) = fed([50; 100]);
        d.excuse(t + ms(1000), ms(100));
        assert_eq!(d.silence(t + ms(1000)), ms(100));
        assert_eq!(d.check(t + ms(1000)), Verdict::Trusted);
        // An excuse never moves the last sign of life back.
        d.excuse(t + ms(1000), ms(900));
        assert_eq!(d.silence(t + ms(1000)), ms(100));
    }

    /// A peer that never heartbeats is judged from the nominal period and
    /// the moment it connected.
    #[test]
    fn a_peer_never_heard_is_judged_from_its_connection() {
        let mut d = PhiAccrual::new(ms(50), ms(200), ms(1000));
        assert_eq!(d.check(ms(1150)), Verdict::Trusted);
        assert_eq!(suspicion_after(&mut d, ms(1000)), ms(200));
    }

    /// Only the last `WINDOW` intervals count: a calm spell after jitter
    /// brings the timeout back down.
    #[test]
    fn the_window_forgets_old_jitter() {
        let jitter = (0..200).map(|i| if i % 4 == 0 { 400 } else { 20 });
        let (mut d, t) = fed(jitter.chain([50; WINDOW]));
        assert_eq!(d.intervals.len(), WINDOW);
        assert_eq!(suspicion_after(&mut d, t), ms(200));
    }
}
