//! The open-file limit of a serving process: raised to its hard limit at
//! start, as nginx's `worker_rlimit_nofile` and HAProxy raise theirs, since
//! every listener, client and backend connection is a descriptor and the
//! usual soft limit (1024) is below what one `flick serve` with many
//! services, or one `flick run` with many clients, holds.

/// Raises the soft limit on open files to the hard limit; the limit then.
pub fn raise_to_hard_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given and nothing else.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads the struct it is given and nothing else.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return Some(lim.rlim_max);
        }
        tracing::warn!(
            soft = { lim.rlim_cur },
            hard = { lim.rlim_max },
            "cannot raise the open-file limit to its hard limit"
        );
    }
    Some(lim.rlim_cur)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_soft_limit_ends_at_the_hard_one() {
        super::raise_to_hard_limit().expect("getrlimit works");
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: as above.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        assert_eq!(lim.rlim_cur, lim.rlim_max);
    }
}
