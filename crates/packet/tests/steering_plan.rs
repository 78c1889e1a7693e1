//! The steering plan of several programs on one port: every program in a
//! cluster has the cluster's key within its own, and the frames of one
//! flow of any program reach one worker of its cluster.

use flick_packet::steering::{DeclaredKey, FlowKey, FrameFields, KeyField, SteeringPlan};
use proptest::prelude::*;

const FIELDS: [KeyField; 5] = [
    KeyField::SrcAddr,
    KeyField::DstAddr,
    KeyField::Proto,
    KeyField::SrcPort,
    KeyField::DstPort,
];

fn any_key() -> impl Strategy<Value = FlowKey> {
    (0u8..32, any::<bool>()).prop_map(|(bits, symmetric)| {
        let fields: Vec<KeyField> = FIELDS
            .into_iter()
            .enumerate()
            .filter(|(i, _)| bits & (1 << i) != 0)
            .map(|(_, f)| f)
            .collect();
        FlowKey::new(&fields, symmetric)
    })
}

fn any_declared() -> impl Strategy<Value = DeclaredKey> {
    prop_oneof![
        8 => any_key().prop_map(DeclaredKey::Key),
        1 => Just(DeclaredKey::Whole),
        1 => Just(DeclaredKey::Opaque),
    ]
}

fn any_frame() -> impl Strategy<Value = FrameFields> {
    // Few distinct values, so that equal addresses and ports occur.
    (0u8..4, 0u8..4, 0u8..3, 0u16..4, 0u16..4).prop_map(|(s, d, proto, sp, dp)| {
        let addr = |v: u8| {
            let mut a = [0u8; 16];
            a[15] = v;
            a
        };
        FrameFields {
            src_addr: addr(s),
            dst_addr: addr(d),
            proto,
            src_port: sp,
            dst_port: dp,
        }
    })
}

/// Another frame of `frame`'s flow under `key`: fields outside the key
/// taken from `other`, and for a symmetric key possibly the other way.
fn same_flow(
    key: &FlowKey,
    frame: &FrameFields,
    other: &FrameFields,
    reverse: bool,
) -> FrameFields {
    let mut g = *frame;
    if key.is_symmetric() && reverse {
        std::mem::swap(&mut g.src_addr, &mut g.dst_addr);
        std::mem::swap(&mut g.src_port, &mut g.dst_port);
    }
    let kept: Vec<KeyField> = key.fields().collect();
    if !kept.contains(&KeyField::SrcAddr) {
        g.src_addr = other.src_addr;
    }
    if !kept.contains(&KeyField::DstAddr) {
        g.dst_addr = other.dst_addr;
    }
    if !kept.contains(&KeyField::Proto) {
        g.proto = other.proto;
    }
    if !kept.contains(&KeyField::SrcPort) {
        g.src_port = other.src_port;
    }
    if !kept.contains(&KeyField::DstPort) {
        g.dst_port = other.dst_port;
    }
    g
}

proptest! {
    #[test]
    fn clusters_keep_each_programs_flows_on_one_worker(
        keys in proptest::collection::vec(any_declared(), 1..6),
        frame in any_frame(),
        other in any_frame(),
        reverse in any::<bool>(),
        workers in 1u64..5,
    ) {
        let plan = SteeringPlan::new(&keys);
        // Each program is in exactly one cluster.
        let mut seen: Vec<usize> = plan.clusters.iter().flat_map(|c| c.programs.clone()).collect();
        seen.sort_unstable();
        prop_assert_eq!(seen, (0..keys.len()).collect::<Vec<_>>());
        for cluster in &plan.clusters {
            match &cluster.key {
                DeclaredKey::Key(ck) => {
                    prop_assert!(!ck.is_empty());
                    for &p in &cluster.programs {
                        let DeclaredKey::Key(pk) = &keys[p] else {
                            return Err(TestCaseError::fail("a keyless program in a keyed cluster"));
                        };
                        prop_assert!(ck.is_coarser_than(pk), "{} within {}", ck, pk);
                        let g = same_flow(pk, &frame, &other, reverse);
                        prop_assert_eq!(
                            ck.hash(&frame) % workers,
                            ck.hash(&g) % workers,
                            "program key {}, cluster key {}: {:?} and {:?}", pk, ck, frame, g
                        );
                    }
                }
                _ => prop_assert_eq!(cluster.programs.len(), 1),
            }
        }
        // Clusters are only split where no common key exists.
        if let [first, ..] = plan.clusters.as_slice() {
            if plan.clusters.len() > 1 {
                let all: Option<FlowKey> = keys.iter().try_fold(None::<FlowKey>, |acc, k| match k {
                    DeclaredKey::Key(k) => Some(Some(acc.map_or(*k, |a| a.common(k)))),
                    _ => None,
                }).flatten();
                if let Some(all) = all {
                    prop_assert!(all.is_empty(), "split though {} is common ({:?})", all, first);
                }
            }
        }
    }
}
