//! The fuzzer's bookkeeping: the step log printed with a failure ([`Log`]), the counts of the
//! whole run ([`Stats`]), the short names errors are counted under ([`error_kind`]), and where
//! every `Buf` of a round is ([`Tracker`]: in hand, held by a queue, or gone), which checks
//! that each comes back exactly once.

use super::{figure, LOG_STEPS};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::IpAddr;
use std::time::Duration;
use uverbs::Error;

/// The last [`LOG_STEPS`] steps of a round, printed when it fails.
pub(crate) struct Log {
    pub(crate) lines: VecDeque<String>,
    step: u64,
    trace: bool,
}

impl Log {
    pub(crate) fn new(trace: bool) -> Self {
        Self {
            lines: VecDeque::with_capacity(LOG_STEPS),
            step: 0,
            trace,
        }
    }

    pub(crate) fn push(&mut self, line: String) {
        self.step += 1;
        let line = format!("{:5} {line}", self.step);
        if self.trace {
            figure(&line);
        }
        if self.lines.len() == LOG_STEPS {
            self.lines.pop_front();
        }
        self.lines.push_back(line);
    }
}

/// Calls, errors and other counts over the whole run.
pub(crate) struct Stats {
    pub(crate) rounds: u64,
    pub(crate) calls: BTreeMap<&'static str, u64>,
    pub(crate) errors: BTreeMap<String, u64>,
    pub(crate) bufs: u64,
    pub(crate) returned: u64,
    pub(crate) dropped_held: u64,
    pub(crate) payloads: u64,
    pub(crate) completions: u64,
    pub(crate) forks: u64,
    pub(crate) raw_refused: u64,
    /// The RDMA CM: its address, or why the CM steps are skipped.
    pub(crate) cm: std::result::Result<IpAddr, String>,
    pub(crate) cm_time: Duration,
    pub(crate) cm_connections: u64,
}

impl Default for Stats {
    fn default() -> Self {
        Self {
            rounds: 0,
            calls: BTreeMap::new(),
            errors: BTreeMap::new(),
            bufs: 0,
            returned: 0,
            dropped_held: 0,
            payloads: 0,
            completions: 0,
            forks: 0,
            raw_refused: 0,
            cm: Err("not looked for".into()),
            cm_time: Duration::ZERO,
            cm_connections: 0,
        }
    }
}

/// The short name of an error: its variant, the verb, and the reason or errno.
pub(crate) fn error_kind(e: &Error) -> String {
    match e {
        Error::WorkRequest { verb, reason, .. } => format!("{verb}:{}", variant(&format!("{reason:?}"))),
        Error::Kernel { verb, errno } => format!("{verb}:{errno:?}"),
        Error::Malformed { verb, .. } | Error::InvalidArgument { verb, .. } | Error::Unsupported { verb, .. } => {
            format!("{verb}:{}", variant(&format!("{e:?}")))
        }
        Error::Rejected { status, .. } => format!("Rejected:{status}"),
        Error::CmEvent { verb, event, status } => format!("{verb}:{event}:{status}"),
        Error::TimedOut { verb, .. } => format!("{verb}:TimedOut"),
        e => variant(&format!("{e:?}")).to_string(),
    }
}

pub(crate) fn variant(debug: &str) -> &str {
    debug.split([' ', '{', '(']).next().unwrap_or(debug)
}

/// The name of a `Buf` for accounting: its region (numbered per round) and offset.
pub(crate) type Key = (u32, usize);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum At {
    Hand,
    Queue(u32),
    Gone,
}

/// Where every `Buf` of the round is.
#[derive(Default)]
pub(crate) struct Tracker {
    pub(crate) at: HashMap<Key, At>,
    per_queue: HashMap<u32, usize>,
}

impl Tracker {
    pub(crate) fn add(&mut self, key: Key) {
        assert!(self.at.insert(key, At::Hand).is_none(), "buffer {key:?} made twice");
    }

    pub(crate) fn post(&mut self, key: Key, q: u32) {
        let at = self.at.get_mut(&key).expect("a buffer of this round");
        assert_eq!(*at, At::Hand, "buffer {key:?} posted to queue {q} from {at:?}");
        *at = At::Queue(q);
        *self.per_queue.entry(q).or_default() += 1;
    }

    pub(crate) fn back(&mut self, key: Key, q: u32, how: &str) {
        let at = self
            .at
            .get_mut(&key)
            .unwrap_or_else(|| panic!("unknown buffer {key:?} {how}"));
        assert_eq!(
            *at,
            At::Queue(q),
            "buffer {key:?} given back ({how}) by queue {q}, but it is {at:?}"
        );
        *at = At::Hand;
        *self.per_queue.get_mut(&q).expect("counted") -= 1;
    }

    pub(crate) fn drop_hand(&mut self, key: Key) {
        let at = self.at.get_mut(&key).expect("a buffer of this round");
        assert_eq!(*at, At::Hand, "buffer {key:?} dropped from hand while {at:?}");
        *at = At::Gone;
    }

    /// The queue went down with its buffers: how many.
    pub(crate) fn drop_queue(&mut self, q: u32) -> usize {
        let mut n = 0;
        for at in self.at.values_mut().filter(|at| **at == At::Queue(q)) {
            *at = At::Gone;
            n += 1;
        }
        let counted = self.per_queue.remove(&q).unwrap_or(0);
        assert_eq!(n, counted, "queue {q}: buffers held");
        n
    }

    pub(crate) fn held(&self, q: u32) -> usize {
        self.per_queue.get(&q).copied().unwrap_or(0)
    }
}
