//! One worker's runnable tasks, by group, served by deficit round robin
//! charged with the time each run took.
//!
//! Groups with runnable tasks take turns. The group at the front runs its
//! tasks in FIFO order while its credit lasts, each run charged with the
//! time it took, and then goes to the back of the turns with a fresh
//! quantum (its weight times the base quantum). Over time every busy group
//! gets CPU in proportion to its weight.
//!
//! A group that had nothing to run and now has (a light service whose
//! request just came in) is served first, for one quantum: FQ-CoDel's
//! "new flows" list, ahead of the "old flows" (RFC 8290, section 4.2). So
//! a light group waits for the run in progress, not for a turn of every
//! busy group. It cannot take that way twice in a row: when its quantum is
//! used up, or its queue is found empty, it joins the old list's back, and
//! it is new again only after it has been found empty there.
//!
//! A group with nothing runnable banks nothing: found empty on the old
//! list, it leaves the turns keeping only its debt (an overrun), and it
//! comes back with one quantum. It is found empty only at the next pop,
//! not when its last task is taken: a task that wakes another of its group
//! on this worker (a reader waking its compute task) keeps the group's
//! turn, so a request's hops run back to back.
//!
//! With one group and no charges this is the plain FIFO queue it replaced:
//! credit never runs out, so pops take tasks in the order they came.
//!
//! Nothing here allocates once a group's queue has grown to its load; the
//! table of groups grows when a group first queues a task on this worker.

use std::collections::VecDeque;

/// Which list of turns a group is on.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
enum Turns {
    #[default]
    None,
    New,
    Old,
}

#[derive(Default)]
struct GroupQueue {
    tasks: VecDeque<u32>,
    /// Nanoseconds the group may still run in its turn; negative: it
    /// overran, and the overrun is taken from its next quantum.
    credit: i64,
    /// The list it is on (possibly with no tasks, until a pop sees it).
    turns: Turns,
    /// Every nanosecond charged to the group on this worker.
    charged: u64,
}

pub(crate) struct RunQueue {
    /// By group id; grown when a group first queues a task here.
    groups: Vec<GroupQueue>,
    /// Groups that came back to work, served first, in order of arrival.
    new: VecDeque<u32>,
    /// Groups taking turns, the one running first.
    old: VecDeque<u32>,
    /// Tasks queued over every group.
    len: usize,
}

impl RunQueue {
    /// A queue whose default group (0) has room for `tasks` without
    /// growing.
    pub(crate) fn with_capacity(tasks: usize) -> RunQueue {
        RunQueue {
            groups: vec![GroupQueue {
                tasks: VecDeque::with_capacity(tasks),
                ..GroupQueue::default()
            }],
            new: VecDeque::with_capacity(16),
            old: VecDeque::with_capacity(16),
            len: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Queues task `id` of `group`; `quantum(g)` is group `g`'s credit per
    /// turn, in nanoseconds (its weight times the base quantum).
    pub(crate) fn push(&mut self, id: u32, group: u32, quantum: impl Fn(u32) -> i64) {
        let g = group as usize;
        if g >= self.groups.len() {
            self.groups.resize_with(g + 1, GroupQueue::default);
        }
        let q = &mut self.groups[g];
        if q.turns == Turns::None {
            q.credit = q.credit.min(0) + quantum(group);
            q.turns = Turns::New;
            self.new.push_back(group);
        }
        q.tasks.push_back(id);
        self.len += 1;
    }

    /// The next task to run and its group.
    pub(crate) fn pop(&mut self, quantum: impl Fn(u32) -> i64) -> Option<(u32, u32)> {
        loop {
            let (group, new) = match self.new.front() {
                Some(g) => (*g, true),
                None => (*self.old.front()?, false),
            };
            let alone = self.new.len() + self.old.len() == 1;
            let q = &mut self.groups[group as usize];
            if q.tasks.is_empty() {
                if new {
                    // Not new again until it is found empty in its turn.
                    self.new.pop_front();
                    q.turns = Turns::Old;
                    self.old.push_back(group);
                } else {
                    // Its turn ends with its work: no credit is kept.
                    self.old.pop_front();
                    q.turns = Turns::None;
                    q.credit = q.credit.min(0);
                }
                continue;
            }
            if q.credit <= 0 {
                let quantum = quantum(group).max(1);
                if alone {
                    // Nobody else waits: the turns it would wait out, at once.
                    q.credit += (-q.credit / quantum + 1) * quantum;
                } else {
                    q.credit += quantum;
                    if new {
                        self.new.pop_front();
                    } else {
                        self.old.pop_front();
                    }
                    q.turns = Turns::Old;
                    self.old.push_back(group);
                    continue;
                }
            }
            let id = q.tasks.pop_front().expect("a group in turn has a task");
            self.len -= 1;
            return Some((id, group));
        }
    }

    /// Charges `group` with a run of `nanos` on this worker (the caller
    /// caps it: see `Shared::max_charge`).
    pub(crate) fn charge(&mut self, group: u32, nanos: u64) {
        if let Some(q) = self.groups.get_mut(group as usize) {
            q.credit -= nanos.min(i64::MAX as u64) as i64;
            q.charged += nanos;
        }
    }

    /// Nanoseconds charged to `group` on this worker.
    pub(crate) fn charged(&self, group: u32) -> u64 {
        self.groups.get(group as usize).map_or(0, |q| q.charged)
    }

    /// Forgets what an earlier group with this id left (its debt and its
    /// charges), for a new group that takes the id.
    pub(crate) fn reset(&mut self, group: u32) {
        if let Some(q) = self.groups.get_mut(group as usize) {
            q.credit = 0;
            q.charged = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: i64 = 50_000;

    /// Runs `turns` pops of a queue whose tasks all yield after `run_ns`,
    /// each charged and queued again; the runs per group.
    fn spin(q: &mut RunQueue, weights: &[u32], turns: usize, run_ns: u64) -> Vec<usize> {
        let quantum = |g: u32| weights[g as usize] as i64 * BASE;
        let mut runs = vec![0; weights.len()];
        for _ in 0..turns {
            let (id, g) = q.pop(quantum).expect("tasks are queued");
            runs[g as usize] += 1;
            q.charge(g, run_ns);
            q.push(id, g, quantum);
        }
        runs
    }

    fn with_tasks(weights: &[u32], per_group: &[(u32, u32)]) -> RunQueue {
        let quantum = |g: u32| weights[g as usize] as i64 * BASE;
        let mut q = RunQueue::with_capacity(16);
        let mut id = 0;
        for &(group, n) in per_group {
            for _ in 0..n {
                q.push(id, group, quantum);
                id += 1;
            }
        }
        q
    }

    #[test]
    fn one_group_is_fifo() {
        let quantum = |_| BASE;
        let mut q = RunQueue::with_capacity(4);
        for id in 0..4 {
            q.push(id, 0, quantum);
        }
        let order: Vec<u32> = (0..4).map(|_| q.pop(quantum).unwrap().0).collect();
        assert_eq!(order, [0, 1, 2, 3]);
        assert!(q.pop(quantum).is_none());
        assert!(q.is_empty());
        // Charged or not, a lone group keeps its order.
        for id in 0..3 {
            q.push(id, 0, quantum);
        }
        q.charge(0, 10 * BASE as u64);
        let order: Vec<u32> = (0..3).map(|_| q.pop(quantum).unwrap().0).collect();
        assert_eq!(order, [0, 1, 2]);
    }

    #[test]
    fn cpu_is_shared_by_weight() {
        let weights = [1, 1, 3];
        let mut q = with_tasks(&weights, &[(1, 4), (2, 4)]);
        // Runs of 20 us: several per quantum, with overruns.
        let runs = spin(&mut q, &weights, 8_000, 20_000);
        let ratio = runs[2] as f64 / runs[1] as f64;
        assert!((2.8..=3.2).contains(&ratio), "{runs:?}");
        assert_eq!(q.len(), 8, "no task is lost");
        assert!(q.charged(2) > 2 * q.charged(1));
    }

    #[test]
    fn runs_longer_than_a_quantum_are_shared_by_weight_too() {
        let weights = [1, 1, 4];
        let mut q = with_tasks(&weights, &[(1, 2), (2, 2)]);
        // Each run overruns even the heavier group's quantum.
        let runs = spin(&mut q, &weights, 4_000, 3 * BASE as u64);
        let ratio = runs[2] as f64 / runs[1] as f64;
        assert!((3.5..=4.5).contains(&ratio), "{runs:?}");
    }

    #[test]
    fn a_group_with_nothing_runnable_banks_no_credit() {
        let weights = [1, 1, 1];
        let quantum = |g: u32| weights[g as usize] as i64 * BASE;
        let mut q = with_tasks(&weights, &[(1, 2), (2, 1)]);
        // Group 2's one task runs once and goes idle; group 1 runs on.
        let mut runs = [0; 3];
        for _ in 0..1_000 {
            let (id, g) = q.pop(quantum).unwrap();
            runs[g as usize] += 1;
            q.charge(g, 10_000);
            if g == 1 {
                q.push(id, g, quantum);
            }
        }
        assert_eq!(runs[2], 1, "{runs:?}");
        // Back with work: it gets one quantum's worth, then group 1 its turn,
        // not the 999 runs it sat out.
        q.push(101, 2, quantum);
        q.push(102, 2, quantum);
        let (mut streak, mut longest, mut back) = (0, 0, 0);
        for _ in 0..200 {
            let (id, g) = q.pop(quantum).unwrap();
            streak = if g == 2 { streak + 1 } else { 0 };
            longest = longest.max(streak);
            back += usize::from(g == 2);
            q.charge(g, 10_000);
            q.push(id, g, quantum);
        }
        assert!(
            longest <= (BASE / 10_000) as usize,
            "{longest} runs in a row"
        );
        assert!((90..=110).contains(&back), "{back} of 200 runs");
    }

    #[test]
    fn a_weight_change_takes_effect_at_the_next_turn() {
        let mut weights = [1, 1, 3];
        let mut q = with_tasks(&weights, &[(1, 3), (2, 3)]);
        let before = spin(&mut q, &weights, 4_000, 10_000);
        assert!(before[2] > 2 * before[1], "{before:?}");
        weights[2] = 1;
        let after = spin(&mut q, &weights, 4_000, 10_000);
        let ratio = after[2] as f64 / after[1] as f64;
        assert!((0.9..=1.1).contains(&ratio), "{after:?}");
    }

    #[test]
    fn a_group_back_at_work_goes_first_once() {
        let weights = [1, 1, 1];
        let quantum = |g: u32| weights[g as usize] as i64 * BASE;
        let mut q = with_tasks(&weights, &[(1, 3)]);
        spin(&mut q, &weights, 10, 20_000);
        // A light group's request comes in: it runs next, not after group
        // 1's turn.
        q.push(50, 2, quantum);
        let (id, g) = q.pop(quantum).unwrap();
        assert_eq!((id, g), (50, 2));
        q.charge(2, 5_000);
        // Its queue is found empty: it waits its turn behind group 1 now,
        // and work that comes meanwhile does not jump ahead again.
        let (id, g) = q.pop(quantum).unwrap();
        assert_eq!(g, 1);
        q.push(51, 2, quantum);
        q.charge(1, 60_000);
        q.push(id, 1, quantum);
        assert_eq!(q.pop(quantum), Some((51, 2)), "its old turn");
        q.charge(2, 5_000);
        // Found empty in its turn, it is new when it comes back.
        assert_eq!(q.pop(quantum).map(|(_, g)| g), Some(1));
        q.push(52, 2, quantum);
        assert_eq!(q.pop(quantum), Some((52, 2)));
    }

    /// A group that uses its quantum, goes idle and is woken again during
    /// the next run, again and again, gets no more than its share by
    /// coming back new.
    #[test]
    fn coming_back_new_does_not_beat_the_weights() {
        let weights = [1, 1, 1];
        let quantum = |g: u32| weights[g as usize] as i64 * BASE;
        let mut q = with_tasks(&weights, &[(1, 2), (2, 1)]);
        let mut time = [0u64; 3];
        let mut waking = None;
        for _ in 0..4_000 {
            let (id, g) = q.pop(quantum).unwrap();
            if let Some(w) = waking.take() {
                q.push(w, 2, quantum);
            }
            // Group 2's task runs a whole quantum and goes idle; group 1's
            // run 10 us and yield.
            let run = if g == 2 { BASE as u64 } else { 10_000 };
            time[g as usize] += run;
            q.charge(g, run);
            if g == 2 {
                waking = Some(id);
            } else {
                q.push(id, g, quantum);
            }
        }
        let ratio = time[2] as f64 / time[1] as f64;
        assert!((0.8..=1.25).contains(&ratio), "{time:?}");
    }

    #[test]
    fn a_task_woken_by_its_group_keeps_the_turn() {
        let weights = [1, 1, 1];
        let quantum = |g: u32| weights[g as usize] as i64 * BASE;
        let mut q = with_tasks(&weights, &[(2, 1), (1, 3)]);
        // Group 2's reader runs briefly and wakes its compute task.
        let (id, g) = q.pop(quantum).unwrap();
        assert_eq!((id, g), (0, 2));
        q.push(10, 2, quantum);
        q.charge(2, 1_000);
        assert_eq!(q.pop(quantum), Some((10, 2)), "not behind group 1");
    }

    #[test]
    fn a_reused_group_id_starts_afresh() {
        let weights = [1, 1];
        let quantum = |g: u32| weights[g as usize] as i64 * BASE;
        let mut q = with_tasks(&weights, &[(1, 1)]);
        let (id, g) = q.pop(quantum).unwrap();
        q.charge(g, 5 * BASE as u64);
        assert_eq!(q.charged(1), 5 * BASE as u64);
        assert!(q.pop(quantum).is_none());
        q.reset(1);
        assert_eq!(q.charged(1), 0);
        q.push(id, 1, quantum);
        assert_eq!(q.pop(quantum), Some((id, 1)));
    }
}
