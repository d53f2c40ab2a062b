//! The rendezvous: rank 0 listens, the other ranks connect and say hello; once all have
//! (or the hello deadline passed) rank 0 sends each the same blob (NCCL's unique id, when
//! there is a communicator across ranks) with the rank's seat in that communicator, then
//! gathers their reports until the gather deadline. Every rank that did not get through is named with
//! what stopped it: missing (no hello), dead (its connection closed), slow (no report in
//! time) or broken (said something this protocol does not allow).
//!
//! Plain threads and blocking sockets: a handful of connections per run, each bounded by a
//! deadline, needs no async runtime.

use super::nccl::Seat;
use super::place::Place;
use super::wire::{self, Body, WireError};
use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Extra time a rank waits beyond rank 0's own deadline, so rank 0 gives up first and the
/// verdict, not a race, says what happened.
const GRACE: Duration = Duration::from_secs(5);

/// A rank's process, as its hello gave it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Peer {
    /// Its host name.
    pub host: String,
    /// Its process id.
    pub pid: u32,
    /// The address its connection came from, as rank 0 saw it (rank 0's own: MASTER_ADDR).
    pub address: String,
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}) pid {}", self.host, self.address, self.pid)
    }
}

/// What became of one rank.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Outcome {
    /// Its report arrived.
    Reported {
        /// Who.
        #[serde(flatten)]
        peer: Peer,
        /// Its local exit code.
        exit_code: i32,
        /// sha256 of the blob it received, hex.
        blob_sha256: String,
        /// Its local report.
        report: serde_json::Value,
    },
    /// No hello was accepted from it before the hello deadline.
    Missing {
        /// Why its hello was refused, when one came.
        refused: Option<String>,
    },
    /// Its connection closed after the hello, before its report arrived.
    Dead {
        /// Who.
        #[serde(flatten)]
        peer: Peer,
    },
    /// It said hello but sent no report before the gather deadline.
    Slow {
        /// Who.
        #[serde(flatten)]
        peer: Peer,
    },
    /// It sent something this protocol does not allow.
    Broken {
        /// Who.
        #[serde(flatten)]
        peer: Peer,
        /// What.
        problem: String,
    },
}

/// What rank 0 gathered.
#[derive(Debug, Default)]
pub struct Gathered {
    /// Every rank by number: `lead` fills in all but rank 0, which its caller adds.
    pub outcomes: BTreeMap<u32, Outcome>,
    /// Hellos refused that belong to no rank of this world (a rank past its size, a second
    /// claim to a rank), each described.
    pub refused: Vec<String>,
    /// Connections that never said hello: another program, or a health check.
    pub ignored: Vec<String>,
}

/// A connection and its first message.
type Arrival = (TcpStream, SocketAddr, Result<Body, WireError>);

/// What rank 0 sends, decided once the hellos are in.
#[derive(Clone, Debug, Default)]
pub struct Broadcast {
    /// The same bytes to every rank.
    pub blob: Vec<u8>,
    /// The seat of each world rank in the communicator across ranks.
    pub seats: BTreeMap<u32, Seat>,
    /// The unique id of a second communicator (NCCL's defaults), for the seated ranks.
    pub second: Option<Vec<u8>>,
    /// Time the ranks need beyond the report deadline before they can report (NCCL's), at
    /// most twice the deadline: followers wait three times it for their receipt.
    pub extra: Duration,
}

/// What a rank received from rank 0.
#[derive(Clone, Debug, Default)]
pub struct Welcomed {
    /// The broadcast bytes: NCCL's unique id when there is a communicator.
    pub blob: Vec<u8>,
    /// This rank's seat in it.
    pub seat: Option<Seat>,
    /// The second communicator's unique id.
    pub second: Option<Vec<u8>>,
}

/// Rank 0: listens on `port` (every interface), admits the other ranks' hellos until all
/// have come or `timeout` passed, asks `broadcast` what to send given the admitted ranks
/// that bring a GPU, sends it, then gathers their reports for up to `timeout` (and the
/// broadcast's `extra`) more. Err only when it cannot listen.
pub fn lead(
    place: &Place,
    port: u16,
    timeout: Duration,
    broadcast: impl FnOnce(&[u32]) -> Broadcast,
) -> Result<Gathered, String> {
    let listener = TcpListener::bind(("0.0.0.0", port)).map_err(|e| {
        format!("cannot listen on port {port}: {e}; pick a free one with --world-port")
    })?;
    let mut roll = call_the_roll(place, listener, Instant::now() + timeout);
    let with_gpu: Vec<u32> = roll
        .joined
        .iter()
        .filter(|(_, (_, _, gpu))| *gpu)
        .map(|(rank, _)| *rank)
        .collect();
    let broadcast = broadcast(&with_gpu);
    let mut outcomes = gather(std::mem::take(&mut roll.joined), &broadcast, timeout);
    for rank in 1..place.world_size {
        outcomes.entry(rank).or_insert_with(|| Outcome::Missing {
            refused: roll.refusals.remove(&rank),
        });
    }
    // A refused claimant to a rank that another process then filled is still worth saying.
    roll.refused.extend(roll.refusals.into_values());
    Ok(Gathered {
        outcomes,
        refused: roll.refused,
        ignored: roll.ignored,
    })
}

/// The hello phase's result.
#[derive(Default)]
struct Roll {
    /// The admitted ranks, with their connections and whether they bring a GPU.
    joined: BTreeMap<u32, (TcpStream, Peer, bool)>,
    /// Why a rank of this world was refused, by rank.
    refusals: BTreeMap<u32, String>,
    /// Refusals that belong to no rank of this world.
    refused: Vec<String>,
    /// Connections that said no hello.
    ignored: Vec<String>,
}

/// Admits hellos until every other rank has come or `deadline` passed.
fn call_the_roll(place: &Place, listener: TcpListener, deadline: Instant) -> Roll {
    let arrivals = accept_hellos(listener, deadline);
    let mut roll = Roll::default();
    while (roll.joined.len() as u32) < place.world_size - 1 {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok((stream, from, hello)) = arrivals.recv_timeout(left) else {
            break;
        };
        roll.admit(place, stream, from, hello);
    }
    // Ranks that come after this point are told so rather than left waiting.
    std::thread::spawn(move || {
        for (mut stream, _, _) in arrivals {
            let reason =
                "rank 0 stopped waiting for hellos (--world-timeout) before this rank came";
            let refusal = Body::Refused {
                reason: reason.into(),
            };
            let _ = wire::send(&mut stream, &refusal, Instant::now() + GRACE);
        }
    });
    roll
}

/// Accepts connections on a thread of its own and reads each one's hello on another, so a
/// silent connection never holds up the rest. The accepting thread ends with the process.
fn accept_hellos(listener: TcpListener, hello_deadline: Instant) -> mpsc::Receiver<Arrival> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        loop {
            let Ok((mut stream, from)) = listener.accept() else {
                // Out of file descriptors, say: wait rather than spin.
                std::thread::sleep(Duration::from_millis(50));
                continue;
            };
            let tx = tx.clone();
            std::thread::spawn(move || {
                // A latecomer still gets a moment to say who it is, to be told it is late.
                let deadline = hello_deadline.max(Instant::now() + GRACE);
                let hello = wire::receive(&mut stream, deadline);
                let _ = tx.send((stream, from, hello));
            });
        }
    });
    rx
}

impl Roll {
    /// Takes a hello into `joined`, or refuses it and says why.
    fn admit(
        &mut self,
        place: &Place,
        mut stream: TcpStream,
        from: SocketAddr,
        hello: Result<Body, WireError>,
    ) {
        let (rank, world_size, peer, job, brings_gpu) = match hello {
            Ok(Body::Hello {
                rank,
                world_size,
                host,
                pid,
                job,
                brings_gpu,
                ..
            }) => {
                let address = from.ip().to_string();
                let peer = Peer { host, pid, address };
                (rank, world_size, peer, job, brings_gpu)
            }
            Ok(other) => {
                self.ignored
                    .push(format!("{from} sent {} before any hello", kind(&other)));
                return;
            }
            Err(e) => {
                self.ignored.push(format!("{from}: {e} instead of a hello"));
                return;
            }
        };
        let who = peer.to_string();
        let problem = if rank == 0 || rank >= place.world_size {
            Some(format!(
                "{who} claims rank {rank}, but this world has ranks 1 to {} besides rank 0",
                place.world_size - 1
            ))
        } else if world_size != place.world_size {
            Some(format!(
                "{who} believes the world has {world_size} ranks; rank 0 has {}",
                place.world_size
            ))
        } else if let (Some(theirs), Some(ours)) = (&job, &place.job)
            && theirs != ours
        {
            Some(format!(
                "{who} belongs to job {theirs}; rank 0 runs job {ours}"
            ))
        } else if let Some((_, first, _)) = self.joined.get(&rank) {
            Some(format!(
                "{who} claims rank {rank}, already taken by {first}"
            ))
        } else {
            None
        };
        let Some(reason) = problem else {
            self.joined.insert(rank, (stream, peer, brings_gpu));
            return;
        };
        let refusal = Body::Refused {
            reason: reason.clone(),
        };
        let _ = wire::send(&mut stream, &refusal, Instant::now() + GRACE);
        // A refusal about a rank of this world explains that rank's absence; the others
        // belong to no rank.
        if rank > 0 && rank < place.world_size && !self.joined.contains_key(&rank) {
            self.refusals.insert(rank, reason);
        } else {
            self.refused.push(reason);
        }
    }
}

/// Sends each admitted rank the broadcast, then gathers the reports until `timeout` (and
/// the broadcast's extra time) from now.
fn gather(
    joined: BTreeMap<u32, (TcpStream, Peer, bool)>,
    broadcast: &Broadcast,
    timeout: Duration,
) -> BTreeMap<u32, Outcome> {
    let timeout = timeout + broadcast.extra;
    let deadline = Instant::now() + timeout;
    let blob = hex::encode(&broadcast.blob);
    let second = broadcast.second.as_deref().map(hex::encode);
    let mut outcomes = BTreeMap::new();
    let (reports, arrived) = mpsc::channel();
    for (rank, (mut stream, peer, _)) in joined {
        let seat = broadcast.seats.get(&rank).copied();
        let welcome = Body::Welcome {
            blob: blob.clone(),
            seat,
            second: seat.and(second.clone()),
        };
        if let Err(e) = wire::send(&mut stream, &welcome, deadline) {
            outcomes.insert(rank, failed(peer, e, timeout));
            continue;
        }
        let reports = reports.clone();
        std::thread::spawn(move || {
            let outcome = gather_one(rank, &mut stream, peer, deadline, timeout);
            let _ = reports.send((rank, outcome, stream));
        });
    }
    drop(reports);
    // Each gatherer gives up by the deadline, so this ends once they all have.
    let mut counted = Vec::new();
    for (rank, outcome, stream) in arrived {
        if matches!(outcome, Outcome::Reported { .. }) {
            counted.push(stream);
        }
        outcomes.insert(rank, outcome);
    }
    // Receipts go out only now, so no rank exits before rank 0 has gathered them all: a
    // launcher that stops every rank once one fails (srun's --kill-on-bad-exit, torchrun's
    // agent on rank 0's node) would otherwise stop rank 0 before its verdict.
    for mut stream in counted {
        let _ = wire::send(&mut stream, &Body::Counted, Instant::now() + GRACE);
    }
    outcomes
}

/// Reads one rank's report.
fn gather_one(
    rank: u32,
    stream: &mut TcpStream,
    peer: Peer,
    deadline: Instant,
    timeout: Duration,
) -> Outcome {
    match wire::receive(stream, deadline) {
        Ok(Body::Report {
            rank: claimed,
            exit_code,
            blob_sha256,
            report,
        }) if claimed == rank => Outcome::Reported {
            peer,
            exit_code,
            blob_sha256,
            report,
        },
        Ok(Body::Report { rank: claimed, .. }) => Outcome::Broken {
            peer,
            problem: format!("said hello as rank {rank}, then reported as rank {claimed}"),
        },
        Ok(other) => Outcome::Broken {
            peer,
            problem: format!("sent {} instead of its report", kind(&other)),
        },
        Err(e) => failed(peer, e, timeout),
    }
}

/// A rank whose connection failed after its hello.
fn failed(peer: Peer, error: WireError, timeout: Duration) -> Outcome {
    match error {
        WireError::Closed => Outcome::Dead { peer },
        WireError::Late => Outcome::Slow { peer },
        WireError::Malformed(problem) => Outcome::Broken { peer, problem },
        WireError::Io(e) => Outcome::Broken {
            peer,
            problem: format!("its connection failed within {} s: {e}", timeout.as_secs()),
        },
    }
}

/// A message's type, to name it.
fn kind(body: &Body) -> &'static str {
    match body {
        Body::Hello { .. } => "a hello",
        Body::Welcome { .. } => "a welcome",
        Body::Refused { .. } => "a refusal",
        Body::Report { .. } => "a report",
        Body::Counted => "a receipt",
    }
}

/// What a rank other than 0 sends.
pub struct Contribution {
    /// Its local exit code.
    pub exit_code: i32,
    /// Its local report as JSON.
    pub report: serde_json::Value,
}

/// Test-only behaviour, so the tests can make a rank die or dawdle at a known step.
#[derive(Clone, Copy, Debug, Default)]
pub struct Rehearsal {
    /// Kill this process once the blob has arrived, before the report goes.
    pub die_before_report: bool,
    /// Wait this long before sending the report.
    pub report_delay: Option<Duration>,
}

/// A rank other than 0: joins rank 0 at `port` (saying whether it brings a GPU), receives
/// the blob and its seat, sends what `contribute` makes of them and waits for the receipt.
/// Ok says where it was counted; Err says which step failed.
pub fn follow(
    place: &Place,
    port: u16,
    timeout: Duration,
    brings_gpu: bool,
    contribute: impl FnOnce(&Welcomed) -> Contribution,
    rehearsal: Rehearsal,
) -> Result<String, String> {
    let endpoint = format!("{}:{port}", place.master_addr);
    let mut stream = connect(
        (place.master_addr.as_str(), port),
        &endpoint,
        place.rank,
        Instant::now() + timeout,
    )?;
    let hello = Body::Hello {
        rank: place.rank,
        world_size: place.world_size,
        host: place.node.clone(),
        pid: std::process::id(),
        job: place.job.clone(),
        gpubake: env!("CARGO_PKG_VERSION").to_string(),
        brings_gpu,
    };
    let step = |what: &str, e: WireError| format!("rank 0 at {endpoint}, {what}: {e}");
    wire::send(&mut stream, &hello, Instant::now() + timeout)
        .map_err(|e| step("saying hello", e))?;
    // Rank 0 waits up to `timeout` for the others' hellos before it sends the blob.
    let (blob, seat, second) = match wire::receive(&mut stream, Instant::now() + timeout + GRACE) {
        Ok(Body::Welcome { blob, seat, second }) => (blob, seat, second),
        Ok(Body::Refused { reason }) => {
            return Err(format!("rank 0 at {endpoint} refused this rank: {reason}"));
        }
        Ok(other) => {
            return Err(format!(
                "rank 0 at {endpoint} sent {} instead of the blob",
                kind(&other)
            ));
        }
        Err(e) => return Err(step("waiting for the blob", e)),
    };
    let not_hex = |e| format!("rank 0 at {endpoint} sent a blob that is not hex: {e}");
    let welcomed = Welcomed {
        blob: hex::decode(&blob).map_err(not_hex)?,
        seat,
        second: second.map(hex::decode).transpose().map_err(not_hex)?,
    };
    if rehearsal.die_before_report {
        // As abrupt as an out-of-memory kill: no destructor, no goodbye.
        // SAFETY: kill(2) on our own pid has no memory effects.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
    let mine = contribute(&welcomed);
    if let Some(delay) = rehearsal.report_delay {
        std::thread::sleep(delay);
    }
    let report = Body::Report {
        rank: place.rank,
        exit_code: mine.exit_code,
        blob_sha256: super::digest(&welcomed.blob),
        report: mine.report,
    };
    let gave_up = || {
        format!(
            "rank 0 at {endpoint} closed the connection before counting the report: it came \
             after rank 0's gather deadline, or rank 0 died"
        )
    };
    match wire::send(&mut stream, &report, Instant::now() + timeout) {
        Ok(()) => {}
        Err(WireError::Closed) => return Err(gave_up()),
        Err(e) => return Err(step("sending the report", e)),
    }
    // Rank 0 sends receipts once it has gathered every report, which can take its deadline
    // and twice as long again when the ranks meet in NCCL twice (`Broadcast::extra`).
    match wire::receive(&mut stream, Instant::now() + 3 * timeout + GRACE) {
        Ok(Body::Counted) => Ok(format!("rank 0 at {endpoint} counted this rank's report")),
        Ok(other) => Err(format!(
            "rank 0 at {endpoint} sent {} instead of a receipt",
            kind(&other)
        )),
        Err(WireError::Closed) => Err(gave_up()),
        Err(e) => Err(step("waiting for the receipt", e)),
    }
}

/// Connects to rank 0, trying again until `deadline`: rank 0 listens only once its own
/// local probe is done, and a pod's DNS name appears only once the pod runs.
fn connect(
    address: (&str, u16),
    endpoint: &str,
    rank: u32,
    deadline: Instant,
) -> Result<TcpStream, String> {
    let mut pause = Duration::from_millis(100);
    let mut last_error = String::from("no attempt");
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!(
                "could not reach rank 0 at {endpoint} before the deadline: {last_error}"
            ));
        }
        // (host, port) rather than "host:port": an IPv6 literal needs no brackets this way.
        match address.to_socket_addrs() {
            Ok(addrs) => {
                for addr in addrs {
                    match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(5))) {
                        Ok(stream) => return Ok(stream),
                        Err(e) => last_error = format!("{addr}: {e}"),
                    }
                }
            }
            Err(e) => last_error = format!("cannot resolve it: {e}"),
        }
        // Ranks spread their retries a little so a thousand of them do not knock at once.
        let jitter = Duration::from_millis(u64::from(rank % 16) * 7);
        std::thread::sleep(
            (pause + jitter).min(deadline.saturating_duration_since(Instant::now())),
        );
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::world::place::Launcher;
    use std::io::Write;

    fn rank_zero(world_size: u32) -> Place {
        Place {
            rank: 0,
            world_size,
            local_rank: 0,
            local_world_size: None,
            node: "node-a".into(),
            master_addr: "127.0.0.1".into(),
            master_port: None,
            job: Some("job-1".into()),
            launcher: Launcher::Torchrun,
        }
    }

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    fn hello(rank: u32, world_size: u32, job: &str) -> Body {
        Body::Hello {
            rank,
            world_size,
            host: format!("node-{rank}"),
            pid: 1000 + rank,
            job: Some(job.into()),
            gpubake: "test".into(),
            brings_gpu: false,
        }
    }

    /// Connects (retrying until rank 0 listens) and says `hello`; returns rank 0's answer.
    fn say(port: u16, hello: &Body) -> (TcpStream, Body) {
        let soon = Instant::now() + Duration::from_secs(5);
        let mut stream = connect(("127.0.0.1", port), "test", 0, soon).unwrap();
        wire::send(&mut stream, hello, soon).unwrap();
        let answer = wire::receive(&mut stream, soon).unwrap();
        (stream, answer)
    }

    #[test]
    fn hellos_that_do_not_fit_the_world_are_refused_and_said() {
        let port = free_port();
        let leader = std::thread::spawn(move || {
            let plain = |_: &[u32]| Broadcast {
                blob: b"blob".to_vec(),
                ..Broadcast::default()
            };
            lead(&rank_zero(4), port, Duration::from_secs(1), plain).unwrap()
        });
        let good = std::thread::spawn(move || {
            let (mut stream, answer) = say(port, &hello(1, 4, "job-1"));
            assert_eq!(
                answer,
                Body::Welcome {
                    blob: hex::encode(b"blob"),
                    seat: None,
                    second: None
                }
            );
            let report = Body::Report {
                rank: 1,
                exit_code: 0,
                blob_sha256: "x".into(),
                report: serde_json::json!({}),
            };
            let soon = Instant::now() + Duration::from_secs(5);
            wire::send(&mut stream, &report, soon).unwrap();
            assert_eq!(wire::receive(&mut stream, soon).unwrap(), Body::Counted);
        });
        // Give the good rank 1 time to be admitted before another claims rank 1.
        std::thread::sleep(Duration::from_millis(300));
        let refusal = |body: Body| match body {
            Body::Refused { reason } => reason,
            other => panic!("admitted: {other:?}"),
        };
        let twice = refusal(say(port, &hello(1, 4, "job-1")).1);
        assert!(
            twice.contains("already taken by node-1 (127.0.0.1) pid 1001"),
            "{twice}"
        );
        let other_size = refusal(say(port, &hello(2, 5, "job-1")).1);
        assert!(
            other_size.contains("believes the world has 5 ranks"),
            "{other_size}"
        );
        let other_job = refusal(say(port, &hello(3, 4, "job-2")).1);
        assert!(other_job.contains("belongs to job job-2"), "{other_job}");
        let mut stranger = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stranger.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();

        good.join().unwrap();
        let gathered = leader.join().unwrap();
        assert!(matches!(gathered.outcomes[&1], Outcome::Reported { .. }));
        for rank in [2, 3] {
            assert!(
                matches!(
                    &gathered.outcomes[&rank],
                    Outcome::Missing { refused: Some(_) }
                ),
                "{:?}",
                gathered.outcomes[&rank]
            );
        }
        assert_eq!(gathered.refused.len(), 1, "{:?}", gathered.refused);
        assert_eq!(gathered.ignored.len(), 1, "{:?}", gathered.ignored);
        assert!(
            gathered.ignored[0].contains("announced"),
            "{:?}",
            gathered.ignored
        );
    }

    #[test]
    fn ranks_with_a_gpu_are_seated_and_told_their_seat() {
        let port = free_port();
        let leader = std::thread::spawn(move || {
            let mut asked = Vec::new();
            let gathered = lead(&rank_zero(3), port, Duration::from_secs(2), |with_gpu| {
                asked = with_gpu.to_vec();
                let seat = |seat| Seat {
                    seat,
                    seats: 2,
                    budget_s: 9,
                };
                Broadcast {
                    blob: b"id".to_vec(),
                    seats: [(0, seat(0)), (2, seat(1))].into(),
                    second: Some(b"id2".to_vec()),
                    extra: Duration::ZERO,
                }
            })
            .unwrap();
            (asked, gathered)
        });
        let join = |rank: u32, brings_gpu: bool| {
            std::thread::spawn(move || {
                let mut hello = hello(rank, 3, "job-1");
                if let Body::Hello { brings_gpu: b, .. } = &mut hello {
                    *b = brings_gpu;
                }
                say(port, &hello).1
            })
        };
        let (one, two) = (join(1, false), join(2, true));
        let welcome = |body: Body| match body {
            Body::Welcome { blob, seat, second } => (blob, (seat, second)),
            other => panic!("{other:?}"),
        };
        let (blob, (seat, second)) = welcome(two.join().unwrap());
        assert_eq!(blob, hex::encode(b"id"));
        assert_eq!(seat.map(|s| (s.seat, s.seats)), Some((1, 2)));
        assert_eq!(second, Some(hex::encode(b"id2")));
        // No seat, no second id either.
        assert_eq!(welcome(one.join().unwrap()).1, (None, None));
        let (asked, _) = leader.join().unwrap();
        assert_eq!(asked, vec![2], "only rank 2 said it brings a GPU");
    }

    #[test]
    fn a_port_in_use_is_said() {
        let taken = TcpListener::bind("0.0.0.0:0").unwrap();
        let port = taken.local_addr().unwrap().port();
        let err = lead(&rank_zero(2), port, Duration::from_secs(1), |_| {
            Broadcast::default()
        })
        .unwrap_err();
        assert!(
            err.contains(&format!("port {port}")) && err.contains("--world-port"),
            "{err}"
        );
    }
}
