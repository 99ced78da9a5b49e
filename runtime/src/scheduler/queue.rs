//! The queues of one model and the choice of the next batch, as Triton's
//! dynamic batcher makes it: a batch of a preferred size goes at once, a
//! full batch goes at once, and otherwise the oldest request waits at most
//! `max_queue_delay_microseconds` for more.
//!
//! This is plain data; `scheduler` adds the threads and the waiting.

use std::collections::VecDeque;
use std::time::Instant;

use super::batch::BatchKey;
use super::policy::Policy;

/// One queued request.
pub struct Entry<J> {
    /// Unique within the queue, for removal on timeout or cancellation.
    pub id: u64,
    /// Its rows (batch dimension).
    pub rows: usize,
    /// What a request must share with it to join its batch.
    pub key: BatchKey,
    /// When it was queued.
    pub enqueued: Instant,
    /// The request itself.
    pub job: J,
}

/// What a worker should do next.
pub enum Next<J> {
    /// Run these requests as one batch, in this order.
    Run(Vec<Entry<J>>),
    /// Nothing to run yet: wait for a new request, or at most until the
    /// given time, when the oldest request's queue delay ends.
    Wait(Option<Instant>),
}

#[derive(Default)]
struct Level<J> {
    waiting: VecDeque<Entry<J>>,
    /// Requests whose timeout expired under `timeout_action: DELAY`.
    delayed: VecDeque<Entry<J>>,
}

/// The queues of every priority level.
pub struct Queue<J> {
    levels: Vec<Level<J>>,
    next_id: u64,
}

impl<J> Queue<J> {
    /// Empty queues for `levels` priority levels.
    pub fn new(levels: usize) -> Queue<J> {
        Queue {
            levels: (0..levels).map(|_| Level { waiting: VecDeque::new(), delayed: VecDeque::new() }).collect(),
            next_id: 0,
        }
    }

    /// Requests queued at `level`.
    pub fn len(&self, level: usize) -> usize {
        self.levels[level].waiting.len() + self.levels[level].delayed.len()
    }

    /// Requests queued at every level.
    pub fn total(&self) -> usize {
        (0..self.levels.len()).map(|l| self.len(l)).sum()
    }

    /// Queues a request at `level`; returns its id.
    pub fn push(&mut self, level: usize, rows: usize, key: BatchKey, job: J) -> u64 {
        self.next_id += 1;
        let entry = Entry { id: self.next_id, rows, key, enqueued: Instant::now(), job };
        self.levels[level].waiting.push_back(entry);
        self.next_id
    }

    /// Takes request `id` out of the queue; `None` if it is no longer queued
    /// (a worker took it).
    pub fn remove(&mut self, level: usize, id: u64) -> Option<Entry<J>> {
        let l = &mut self.levels[level];
        for deque in [&mut l.waiting, &mut l.delayed] {
            if let Some(i) = deque.iter().position(|e| e.id == id) {
                return deque.remove(i);
            }
        }
        None
    }

    /// Moves request `id` behind every request of its level that has not
    /// timed out; false if it is no longer queued.
    pub fn delay(&mut self, level: usize, id: u64) -> bool {
        let l = &mut self.levels[level];
        match l.waiting.iter().position(|e| e.id == id).and_then(|i| l.waiting.remove(i)) {
            Some(entry) => {
                l.delayed.push_back(entry);
                true
            }
            None => l.delayed.iter().any(|e| e.id == id),
        }
    }

    /// The order requests are considered in: by priority level, and within
    /// a level the timely requests before the delayed ones (as Triton's
    /// priority queue orders them).
    fn ordered(&self) -> impl Iterator<Item = &Entry<J>> {
        self.levels.iter().flat_map(|l| l.waiting.iter().chain(&l.delayed))
    }

    /// Chooses the next batch at time `now` and takes it out of the queue.
    pub fn next(&mut self, policy: &Policy, now: Instant) -> Next<J> {
        let (count, preferred_count, blocked, oldest) = self.candidate(policy);
        let Some(oldest) = oldest else { return Next::Wait(None) };
        let take = if blocked {
            count
        } else if let Some(n) = preferred_count {
            n
        } else if now >= oldest + policy.max_queue_delay {
            count
        } else {
            return Next::Wait(Some(oldest + policy.max_queue_delay));
        };
        let mut batch = Vec::with_capacity(take);
        for level in &mut self.levels {
            for deque in [&mut level.waiting, &mut level.delayed] {
                while batch.len() < take {
                    match deque.pop_front() {
                        Some(e) => batch.push(e),
                        None => break,
                    }
                }
            }
        }
        Next::Run(batch)
    }

    /// The longest run of requests, in order, that can share a batch:
    /// (its length, the length of its longest prefix of a preferred size,
    /// whether it cannot grow any more, its oldest arrival).
    fn candidate(&self, policy: &Policy) -> (usize, Option<usize>, bool, Option<Instant>) {
        let (mut count, mut rows, mut preferred, mut blocked, mut oldest) = (0, 0, None, false, None::<Instant>);
        let mut entries = self.ordered();
        let Some(first) = entries.next() else { return (0, None, false, None) };
        for e in std::iter::once(first).chain(entries) {
            let joins = count == 0 || (policy.dynamic_batching && e.key == first.key);
            if !joins || rows + e.rows > policy.max_batch_size {
                blocked = true;
                break;
            }
            count += 1;
            rows += e.rows;
            oldest = Some(oldest.map_or(e.enqueued, |o| o.min(e.enqueued)));
            if policy.preferred_batch_sizes.contains(&rows) {
                preferred = Some(count);
            }
        }
        // Without dynamic batching every request runs alone, at once.
        let full = blocked || rows >= policy.max_batch_size || !policy.dynamic_batching;
        (count, preferred, full, oldest)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::scheduler::policy::QueuePolicy;
    use crate::tensor::DataType;

    fn policy(max: usize, preferred: &[usize], delay_us: u64, levels: usize) -> Policy {
        Policy {
            batch_dimension: true,
            dynamic_batching: true,
            max_batch_size: max,
            preferred_batch_sizes: preferred.to_vec(),
            max_queue_delay: Duration::from_micros(delay_us),
            preserve_ordering: false,
            levels: vec![QueuePolicy::UNBOUNDED; levels],
            default_level: 0,
            layout: Default::default(),
        }
    }

    fn key(width: i64) -> BatchKey {
        vec![("x".into(), DataType::Fp32, vec![width])]
    }

    fn run_rows(next: Next<u32>) -> Vec<u32> {
        match next {
            Next::Run(batch) => batch.into_iter().map(|e| e.job).collect(),
            Next::Wait(_) => panic!("expected a batch"),
        }
    }

    #[test]
    fn waits_for_the_delay_then_sends_what_it_has() {
        let p = policy(8, &[], 1000, 1);
        let mut q = Queue::new(1);
        q.push(0, 1, key(4), 1);
        q.push(0, 3, key(4), 2);
        let now = Instant::now();
        assert!(matches!(q.next(&p, now), Next::Wait(Some(_))));
        assert_eq!(run_rows(q.next(&p, now + Duration::from_millis(2))), vec![1, 2]);
        assert!(matches!(q.next(&p, now), Next::Wait(None)));
    }

    #[test]
    fn full_and_preferred_batches_go_at_once() {
        let now = Instant::now();
        let mut q = Queue::new(1);
        for job in 0..5 {
            q.push(0, 2, key(4), job);
        }
        assert_eq!(run_rows(q.next(&policy(8, &[], 1_000_000, 1), now)), vec![0, 1, 2, 3]);
        q.push(0, 1, key(4), 5);
        // Rows now: 2 and 1; preferred 2 is the longest preferred prefix.
        assert_eq!(run_rows(q.next(&policy(8, &[2], 1_000_000, 1), now)), vec![4]);
    }

    #[test]
    fn requests_of_other_shapes_wait_for_the_next_batch() {
        let mut q = Queue::new(1);
        q.push(0, 1, key(4), 0);
        q.push(0, 1, key(5), 1);
        q.push(0, 1, key(4), 2);
        let p = policy(8, &[], 1_000_000, 1);
        assert_eq!(run_rows(q.next(&p, Instant::now())), vec![0]);
        assert_eq!(run_rows(q.next(&p, Instant::now())), vec![1]);
    }

    #[test]
    fn higher_priority_then_timely_requests_go_first() {
        let mut q = Queue::new(2);
        q.push(1, 1, key(4), 10);
        let delayed = q.push(1, 1, key(4), 15);
        q.push(1, 1, key(4), 16);
        assert!(q.delay(1, delayed));
        let late = q.push(0, 1, key(4), 20);
        q.push(0, 1, key(4), 30);
        assert!(q.delay(0, late));
        assert_eq!(run_rows(q.next(&policy(8, &[], 0, 2), Instant::now())), vec![30, 20, 10, 16, 15]);
    }

    #[test]
    fn removed_requests_are_never_run() {
        let mut q = Queue::new(1);
        let id = q.push(0, 1, key(4), 0);
        q.push(0, 1, key(4), 1);
        assert!(q.remove(0, id).is_some());
        assert!(q.remove(0, id).is_none());
        assert_eq!(q.total(), 1);
        assert_eq!(run_rows(q.next(&policy(8, &[], 0, 1), Instant::now())), vec![1]);
    }

    #[test]
    fn without_dynamic_batching_each_request_runs_alone() {
        let mut p = policy(8, &[], 0, 1);
        p.dynamic_batching = false;
        let mut q = Queue::new(1);
        q.push(0, 1, key(4), 0);
        q.push(0, 1, key(4), 1);
        assert_eq!(run_rows(q.next(&p, Instant::now())), vec![0]);
    }
}
