//! What the rest of the machine did during a run: the share of CPU time the hypervisor took
//! (steal), how busy all cores were, and how long tasks stalled on I/O.
//!
//! The bench shares a small VM with the server it measures; on a busy host the same binary can
//! lose a third of its CPU to steal or its disk to a throttled burst budget, and a figure read
//! without that context misleads. Linux only (`/proc/stat`, `/proc/pressure/io`); elsewhere
//! the report has no `machine` section.

use serde::Serialize;

/// Cumulative counters at one instant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// `/proc/stat` aggregate `cpu` line, in clock ticks: busy (user, nice, system, irq,
    /// softirq), idle (idle, iowait), steal.
    busy: u64,
    idle: u64,
    steal: u64,
    /// `/proc/pressure/io` `some` total, in microseconds (absent without PSI).
    io_some_us: Option<u64>,
    at: std::time::Instant,
}

/// The machine's load between two samples.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Load {
    /// Share of all CPU time (every core) the hypervisor gave to others, in percent.
    pub steal_pct: f64,
    /// Cores busy on average (every process: server, bench and the rest).
    pub busy_cores: f64,
    /// Share of wall time at least one task waited for I/O (PSI `some`), in percent.
    pub io_stall_pct: Option<f64>,
}

/// Parses the aggregate `cpu` line of `/proc/stat` into (busy, idle, steal) ticks.
fn parse_stat(text: &str) -> Option<(u64, u64, u64)> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal [guest guest_nice: inside user/nice]
    let get = |i: usize| f.get(i).copied().unwrap_or(0);
    let busy = get(0) + get(1) + get(2) + get(5) + get(6);
    Some((busy, get(3) + get(4), get(7)))
}

/// Parses `total=` of the `some` line of `/proc/pressure/io`.
fn parse_pressure(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("some "))?;
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix("total="))
        .and_then(|v| v.parse().ok())
}

impl Sample {
    /// The counters now, or `None` where `/proc/stat` is not there to read.
    pub fn now() -> Option<Sample> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let (busy, idle, steal) = parse_stat(&stat)?;
        let io_some_us = std::fs::read_to_string("/proc/pressure/io")
            .ok()
            .and_then(|t| parse_pressure(&t));
        Some(Sample {
            busy,
            idle,
            steal,
            io_some_us,
            at: std::time::Instant::now(),
        })
    }

    /// The load from `self` to `later`.
    pub fn load_until(&self, later: &Sample) -> Load {
        let d = |a: u64, b: u64| b.saturating_sub(a) as f64;
        let busy = d(self.busy, later.busy);
        let steal = d(self.steal, later.steal);
        let total = busy + d(self.idle, later.idle) + steal;
        let wall = later.at.saturating_duration_since(self.at).as_secs_f64();
        let ticks_per_sec = clock_ticks_per_sec();
        let pct = |x: f64, of: f64| if of > 0.0 { 100.0 * x / of } else { 0.0 };
        Load {
            steal_pct: pct(steal, total),
            busy_cores: if wall > 0.0 {
                busy / ticks_per_sec / wall
            } else {
                0.0
            },
            io_stall_pct: match (self.io_some_us, later.io_some_us) {
                (Some(a), Some(b)) if wall > 0.0 => {
                    Some(pct(b.saturating_sub(a) as f64, wall * 1e6).min(100.0))
                }
                _ => None,
            },
        }
    }
}

/// `USER_HZ`, the unit of `/proc/stat`.
fn clock_ticks_per_sec() -> f64 {
    (rustix::param::clock_ticks_per_second() as f64).max(1.0)
}

impl Load {
    pub fn line(&self) -> String {
        let io = match self.io_stall_pct {
            Some(p) => format!(", I/O stalled {p:.0}% of the time"),
            None => String::new(),
        };
        format!(
            "machine: {:.2} cores busy (all processes), {:.1}% of CPU time stolen by the hypervisor{io}",
            self.busy_cores, self.steal_pct
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str =
        "cpu  100 5 50 800 40 3 2 20 0 0\ncpu0 50 2 25 400 20 1 1 10 0 0\nintr 1 2 3\n";

    #[test]
    fn stat_and_pressure_parse() {
        assert_eq!(parse_stat(STAT), Some((160, 840, 20)));
        assert_eq!(parse_stat("intr 1\n"), None);
        assert_eq!(parse_stat("cpu  1 x 3\n"), None);
        let psi = "some avg10=0.05 avg60=1.36 avg300=5.11 total=130979326\nfull avg10=0.00 avg60=1.20 avg300=4.90 total=120000000\n";
        assert_eq!(parse_pressure(psi), Some(130_979_326));
        assert_eq!(parse_pressure("full total=5\n"), None);
    }

    #[test]
    fn load_is_the_difference_between_samples() {
        let t0 = std::time::Instant::now();
        let a = Sample {
            busy: 1000,
            idle: 1000,
            steal: 0,
            io_some_us: Some(0),
            at: t0,
        };
        // Two seconds on two cores = 400 ticks: 250 busy, 50 idle, 100 stolen.
        let b = Sample {
            busy: 1250,
            idle: 1050,
            steal: 100,
            io_some_us: Some(500_000),
            at: t0 + std::time::Duration::from_secs(2),
        };
        let l = a.load_until(&b);
        assert!((l.steal_pct - 25.0).abs() < 1e-9, "{l:?}");
        assert!((l.busy_cores - 1.25).abs() < 1e-9, "{l:?}");
        assert_eq!(l.io_stall_pct, Some(25.0));
        let no_psi = Sample {
            io_some_us: None,
            ..b
        };
        assert_eq!(a.load_until(&no_psi).io_stall_pct, None);
        assert!(
            l.line().contains("25.0% of CPU time stolen"),
            "{}",
            l.line()
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_machine_reports_a_sane_load() {
        let a = Sample::now().expect("/proc/stat readable");
        std::thread::sleep(std::time::Duration::from_millis(50));
        let b = Sample::now().expect("/proc/stat readable twice");
        let l = a.load_until(&b);
        assert!((0.0..=100.0).contains(&l.steal_pct), "{l:?}");
        assert!(l.busy_cores >= 0.0, "{l:?}");
    }
}
