//! The probe's time budgets, in one place so that whoever waits for the probe (certify, a CI
//! job, a scheduler's prolog) can wait for its worst case rather than a guess.
//!
//! A level's budget is a hard limit on the whole run: every step's own budget is cut to what
//! is left of the level's, and a step still running when the level's time is up is stopped and
//! reported as a failure that names it.

use std::time::{Duration, Instant};

/// How deep the probe looks, and so how long a scheduler must allow for it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Reads only: the environment, container limits, NVML's health, the driver against the
    /// lock. Nothing runs on the GPUs.
    Passive = 1,
    /// Runs on the GPUs: copies, the all-reduce, NCCL's effective settings, the framework.
    #[default]
    Active = 2,
    /// Level 2, then sustained GEMMs on every GPU with health read under load and a check
    /// for silent data corruption.
    Burn = 3,
}

impl Level {
    /// The level numbered `n` (1, 2, 3).
    pub fn from_number(n: u8) -> Option<Level> {
        match n {
            1 => Some(Level::Passive),
            2 => Some(Level::Active),
            3 => Some(Level::Burn),
            _ => None,
        }
    }

    /// Its number, as `--level` takes it.
    pub fn number(self) -> u8 {
        self as u8
    }
}

/// Level 1's budget: every read it makes is local, a hung driver call included.
pub const PASSIVE: Duration = Duration::from_secs(10);
/// Level 2's budget.
pub const ACTIVE: Duration = Duration::from_secs(120);
/// What level 3 allows beyond level 2 and the burn itself: starting the burn's workers on
/// every GPU and comparing their results.
pub const BURN_MARGIN: Duration = Duration::from_secs(60);
/// The burn's default length.
pub const BURN_DEFAULT: Duration = Duration::from_secs(600);

/// The hard budget of `level`; level 3's grows with the burn's length.
pub fn of_level(level: Level, burn: Duration) -> Duration {
    match level {
        Level::Passive => PASSIVE,
        Level::Active => ACTIVE,
        Level::Burn => ACTIVE + burn + BURN_MARGIN,
    }
}

/// How long NVML may take to answer before the driver counts as hung.
pub fn nvml(quick: bool) -> Duration {
    Duration::from_secs(if quick { 10 } else { 30 })
}

/// How long one worker process (CUDA copies, an all-reduce ladder, one NCCL run) may take.
pub fn worker(quick: bool) -> Duration {
    Duration::from_secs(if quick { 20 } else { 120 })
}

/// How long the framework check may take, every rank included: importing torch, CUDA's start,
/// a GEMM, a convolution and ProcessGroupNCCL's rendezvous and all-reduces.
pub fn framework(quick: bool) -> Duration {
    Duration::from_secs(if quick { 60 } else { 180 })
}

/// Worker runs one probe makes at most: the copies and the all-reduce, plus, when not quick,
/// NCCL with the preset, with its defaults, and once more with the preset logging what it
/// applied.
fn worker_runs(quick: bool) -> u32 {
    if quick { 2 } else { 5 }
}

/// The longest a probe of `level` can run before every step has hit its budget: the level's
/// budget, or less where the steps' own budgets add up to less.
pub fn worst_case(level: Level, quick: bool, burn: Duration) -> Duration {
    let steps = match level {
        Level::Passive => nvml(quick) * 2,
        Level::Active => nvml(quick) * 2 + worker(quick) * worker_runs(quick) + framework(quick),
        Level::Burn => {
            nvml(quick) * 2
                + worker(quick) * worker_runs(quick)
                + framework(quick)
                + burn
                + BURN_MARGIN
        }
    };
    steps.min(of_level(level, burn))
}

/// The time left to a level's run.
#[derive(Clone, Copy, Debug)]
pub struct Deadline {
    start: Instant,
    budget: Duration,
    level: Level,
    /// The run's steps: its own, so two runs in one process (tests) never mix theirs. One
    /// small record leaked per run keeps the deadline `Copy` for every step it is handed to.
    steps: &'static std::sync::Mutex<Steps>,
}

/// The step a run is in, and the one its level's time ran out in.
#[derive(Debug)]
struct Steps {
    current: &'static str,
    overran: Option<&'static str>,
}

impl Deadline {
    /// A run of `level` allowed `budget` from now.
    pub fn new(level: Level, budget: Duration) -> Deadline {
        Deadline {
            start: Instant::now(),
            budget,
            level,
            steps: Box::leak(Box::new(std::sync::Mutex::new(Steps {
                current: "start",
                overran: None,
            }))),
        }
    }

    /// Time spent since the run started.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// No limit beyond each step's own (the ranks of `probe --world`, whose own timeout
    /// rules them).
    pub fn unlimited() -> Deadline {
        Deadline::new(Level::Active, Duration::MAX / 4)
    }

    /// The level it limits.
    pub fn level(&self) -> Level {
        self.level
    }

    /// The whole budget.
    pub fn budget(&self) -> Duration {
        self.budget
    }

    /// Time left, zero once it has passed.
    pub fn left(&self) -> Duration {
        self.budget.saturating_sub(self.start.elapsed())
    }

    /// Whether the time is up.
    pub fn passed(&self) -> bool {
        self.left().is_zero()
    }

    /// A step's own budget, cut to what is left of the level's.
    pub fn cut(&self, step: Duration) -> Duration {
        step.min(self.left())
    }
}

/// A step's budget within a level's: what the step may take on its own, cut at the time it
/// starts to what is left of the level.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    /// The step's own limit.
    pub step: Duration,
    /// The level's.
    pub deadline: Deadline,
}

impl Budget {
    /// `step`, within `deadline`.
    pub fn new(step: Duration, deadline: Deadline) -> Budget {
        Budget { step, deadline }
    }

    /// The time a step starting now may take.
    pub fn now(&self) -> Duration {
        self.deadline.cut(self.step)
    }

    /// Why a step given `allowed` was stopped: its own limit, or the level's end.
    pub fn stopped(&self, allowed: Duration) -> String {
        if allowed < self.step {
            format!(
                "stopped after {:.0} s at the end of level {}'s {} s budget",
                allowed.as_secs_f64(),
                self.deadline.level.number(),
                self.deadline.budget.as_secs()
            )
        } else {
            format!("no result within {} s", allowed.as_secs())
        }
    }
}

/// The test hook: the name of a step (`container limits`, say) that is entered and never
/// left, to show the watchdog of `probe` reporting a run that did not return.
pub const HANG_HOOK: &str = "GPUBAKE_TEST_HANG_STEP";

/// The step the process's probe is in, for a watchdog on another thread that must report a
/// run that never returned.
static STEP: std::sync::Mutex<&str> = std::sync::Mutex::new("start");

/// The step the probe is in.
pub fn current_step() -> &'static str {
    *STEP.lock().unwrap_or_else(|e| e.into_inner())
}

impl Deadline {
    /// Leaves the current step for `step`; the step being left is the one that ran past the
    /// level's end if the time is up and no earlier step did.
    pub fn enter(&self, step: &'static str) {
        {
            let mut steps = self.steps.lock().unwrap_or_else(|e| e.into_inner());
            if self.passed() {
                let current = steps.current;
                steps.overran.get_or_insert(current);
            }
            steps.current = step;
            *STEP.lock().unwrap_or_else(|e| e.into_inner()) = step;
        }
        if std::env::var_os(HANG_HOOK).is_some_and(|v| v == step) {
            // The test hook: this step never returns, as a driver call that hangs where no
            // step budget can stop it, so that the watchdog's verdict can be seen.
            loop {
                std::thread::park();
            }
        }
    }

    /// The step during which the level's time ran out, if it has.
    pub fn overran(&self) -> Option<&'static str> {
        if !self.passed() {
            return None;
        }
        let steps = self.steps.lock().unwrap_or_else(|e| e.into_inner());
        Some(steps.overran.unwrap_or(steps.current))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worst_case_covers_every_phase_and_stays_in_the_level() {
        let burn = BURN_DEFAULT;
        assert_eq!(worst_case(Level::Passive, false, burn), PASSIVE);
        assert_eq!(worst_case(Level::Active, false, burn), ACTIVE);
        assert!(worst_case(Level::Active, true, burn) <= worst_case(Level::Active, false, burn));
        assert_eq!(
            worst_case(Level::Burn, false, burn),
            ACTIVE + burn + BURN_MARGIN
        );
    }

    #[test]
    fn levels_are_numbered_as_the_flag_takes_them() {
        for n in 1..=3 {
            assert_eq!(Level::from_number(n).unwrap().number(), n);
        }
        assert!(Level::from_number(0).is_none() && Level::from_number(4).is_none());
    }

    #[test]
    fn a_step_gets_at_most_what_is_left() {
        let d = Deadline::new(Level::Passive, Duration::from_secs(10));
        assert!(d.cut(Duration::from_secs(30)) <= Duration::from_secs(10));
        assert_eq!(d.cut(Duration::from_millis(5)), Duration::from_millis(5));
        let gone = Deadline::new(Level::Passive, Duration::ZERO);
        assert!(gone.passed() && gone.cut(Duration::from_secs(1)).is_zero());
        let step = Budget::new(Duration::from_secs(30), gone);
        assert!(step.stopped(step.now()).contains("level 1's 0 s budget"));
        let own = Budget::new(Duration::from_secs(30), Deadline::unlimited());
        assert_eq!(own.stopped(own.now()), "no result within 30 s");
    }

    #[test]
    fn the_step_named_is_the_one_the_time_ran_out_in() {
        let d = Deadline::new(Level::Passive, Duration::from_millis(30));
        d.enter("first");
        assert_eq!(d.overran(), None);
        std::thread::sleep(Duration::from_millis(40));
        d.enter("second");
        d.enter("third");
        assert_eq!(d.overran(), Some("first"));
    }
}
