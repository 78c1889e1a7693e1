//! One set of workers for many services: the scheduler and the reactor,
//! started once, and what the services on them share (the parked-stream
//! handler, which the reactor takes once, and the once-a-second pool
//! trimming).
//!
//! A service on a platform is a tenant: it registers itself when it
//! starts and leaves when it stops, and nothing of another tenant is
//! touched either way. A parked stream's key carries its tenant's number
//! in its upper bits, so one handler routes every parked readiness to its
//! service.
//!
//! Each tenant's tasks run in a scheduler group of its own, with the
//! weight its configuration gives (`ServiceConfig::weight`): while several
//! tenants have work on a worker, they share its time by weight, so a
//! tenant busy with heavy folds cannot starve a light one.

use flick_runtime::io::Reactor;
use flick_runtime::{Policy, Scheduler, SchedulerConfig};
use std::sync::{Arc, RwLock, Weak};

/// What the platform calls back into a service with.
pub(crate) trait Tenant: Send + Sync {
    /// A parked client connection of this service has bytes (or closed).
    fn unpark(&self, key: usize);
    /// Once a second: trim pools, close idle backend connections.
    fn every_second(&self);
}

/// Bits of a parked stream's key that belong to the service; the tenant's
/// number sits above them.
pub(crate) const TENANT_SHIFT: u32 = 32;

#[derive(Clone, Debug)]
pub struct PlatformConfig {
    /// Worker threads; by default one per core.
    pub workers: usize,
    pub policy: Policy,
    /// The most tasks alive at once over every service (their table is
    /// allocated up front): a service's instances need a compute task and
    /// a reader and a writer per connection.
    pub tasks: usize,
    /// Pin worker `i` to the `i`-th core the process may run on. Off by
    /// default: a pinned worker cannot leave a core that the backends or
    /// other programs are woken on (on a 2-core machine shared with
    /// memcached and the load, a pinned Memcached proxy did 0.8x the
    /// operations of the same one unpinned).
    pub pin: bool,
}

impl Default for PlatformConfig {
    fn default() -> PlatformConfig {
        PlatformConfig {
            workers: std::thread::available_parallelism().map_or(1, |n| n.get()),
            policy: Policy::default(),
            tasks: 1 << 18,
            pin: false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PlatformError {
    #[error("cannot start the reactor: {0}")]
    Reactor(std::io::Error),
    #[error("cannot start the housekeeping thread: {0}")]
    Thread(std::io::Error),
}

struct Tenants {
    slots: Vec<Option<Arc<dyn Tenant>>>,
    free: Vec<usize>,
}

struct Shared {
    scheduler: Arc<Scheduler>,
    reactor: Arc<Reactor>,
    tenants: RwLock<Tenants>,
}

/// The workers, their epoll instances and the services on them. Cloning
/// gives another handle to the same platform; the workers stop when the
/// last handle (and the last service) is gone.
#[derive(Clone)]
pub struct Platform {
    shared: Arc<Shared>,
}

impl Platform {
    pub fn start(config: PlatformConfig) -> Result<Platform, PlatformError> {
        crate::service::settle_allocator();
        let scheduler = Arc::new(Scheduler::start(SchedulerConfig {
            workers: config.workers.max(1),
            policy: config.policy,
            capacity: config.tasks.max(64),
            pin: config.pin,
        }));
        let reactor = Arc::new(Reactor::start(scheduler.waker()).map_err(PlatformError::Reactor)?);
        let shared = Arc::new(Shared {
            scheduler,
            reactor: reactor.clone(),
            tenants: RwLock::new(Tenants {
                slots: Vec::new(),
                free: Vec::new(),
            }),
        });
        {
            let weak = Arc::downgrade(&shared);
            reactor.on_parked(Box::new(move |key| {
                let Some(s) = weak.upgrade() else { return };
                if let Some(t) = s.tenant(key >> TENANT_SHIFT) {
                    t.unpark(key & ((1 << TENANT_SHIFT) - 1));
                }
            }));
        }
        let weak = Arc::downgrade(&shared);
        std::thread::Builder::new()
            .name("flick-trim".into())
            .spawn(move || housekeeping(weak))
            .map_err(PlatformError::Thread)?;
        Ok(Platform { shared })
    }

    pub fn workers(&self) -> usize {
        self.shared.scheduler.workers()
    }

    /// Tasks alive now, over every service.
    pub fn live_tasks(&self) -> usize {
        self.shared.scheduler.live()
    }

    pub(crate) fn scheduler(&self) -> &Arc<Scheduler> {
        &self.shared.scheduler
    }

    pub(crate) fn reactor(&self) -> &Arc<Reactor> {
        &self.shared.reactor
    }

    /// Registers a service; its number, for its parked keys.
    pub(crate) fn join(&self, tenant: Arc<dyn Tenant>) -> usize {
        let mut t = self.shared.tenants.write().expect("tenants lock");
        match t.free.pop() {
            Some(i) => {
                t.slots[i] = Some(tenant);
                i
            }
            None => {
                t.slots.push(Some(tenant));
                t.slots.len() - 1
            }
        }
    }

    /// A service leaves; its number may be given to the next one.
    pub(crate) fn leave(&self, id: usize) {
        let mut t = self.shared.tenants.write().expect("tenants lock");
        if let Some(slot) = t.slots.get_mut(id) {
            if slot.take().is_some() {
                t.free.push(id);
            }
        }
    }

    /// Scheduler groups alive now: one per service with a weight, kept
    /// until its last task ends.
    pub fn groups(&self) -> usize {
        self.shared.scheduler.groups()
    }

    /// Services on the platform now.
    pub fn services(&self) -> usize {
        let t = self.shared.tenants.read().expect("tenants lock");
        t.slots.len() - t.free.len()
    }
}

impl Shared {
    fn tenant(&self, id: usize) -> Option<Arc<dyn Tenant>> {
        let t = self.tenants.read().expect("tenants lock");
        t.slots.get(id).and_then(Clone::clone)
    }
}

/// Once a second, every service trims its pools, for as long as the
/// platform runs: one thread however many services there are.
fn housekeeping(shared: Weak<Shared>) {
    loop {
        std::thread::sleep(std::time::Duration::from_secs(1));
        let Some(s) = shared.upgrade() else { return };
        let tenants: Vec<Arc<dyn Tenant>> = {
            let t = s.tenants.read().expect("tenants lock");
            t.slots.iter().flatten().cloned().collect()
        };
        drop(s);
        for t in tenants {
            t.every_second();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Loaded, Service, ServiceConfig};
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpStream};
    use std::time::Duration;

    fn static_web() -> Loaded {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../examples/static_web.flick"
        );
        let src = std::fs::read_to_string(path).unwrap();
        let (program, diags) = flick_syntax::parse(&src);
        assert!(diags.is_empty());
        let (checked, diags) = flick_check::check(&program);
        assert!(diags.is_empty());
        let grammar = flick_wire::Grammar::stock("http").unwrap();
        Loaded::new(&program, &checked, grammar).unwrap()
    }

    fn on_free_port() -> ServiceConfig {
        let addr = format!("127.0.0.1:{}", flick_testkit::free_port());
        ServiceConfig {
            listen: vec![("client".into(), addr.parse().unwrap())],
            max_instances: 16,
            reuse_port: true,
            ..ServiceConfig::default()
        }
    }

    const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";

    fn get(addr: SocketAddr) -> std::io::Result<String> {
        let mut s = TcpStream::connect(addr)?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")?;
        let mut answer = String::new();
        s.read_to_string(&mut answer)?;
        Ok(answer)
    }

    #[test]
    fn services_share_the_workers_and_one_stops_alone() {
        let platform = Platform::start(PlatformConfig {
            workers: 2,
            tasks: 4096,
            pin: false,
            ..PlatformConfig::default()
        })
        .unwrap();
        let a = Service::start_on(&platform, static_web(), on_free_port()).unwrap();
        let b = Service::start_on(&platform, static_web(), on_free_port()).unwrap();
        assert_eq!(platform.services(), 2);
        for s in [&a, &b] {
            assert!(get(s.local_addr()).unwrap().contains("Hello from Flick"));
        }
        // A client of `a` that keeps its connection open.
        let mut open = TcpStream::connect(a.local_addr()).unwrap();
        open.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        open.write_all(GET).unwrap();
        let mut first = [0u8; 16];
        open.read_exact(&mut first).unwrap();

        let stopped = a.stop(Duration::from_secs(5));
        assert!(stopped.drained, "{stopped:?}");
        assert_eq!(stopped.clients_left, 0);
        assert_eq!(a.listeners(), 0);
        assert_eq!(platform.services(), 1);
        assert!(get(a.local_addr()).is_err(), "nothing listens for `a`");
        let mut rest = Vec::new();
        open.read_to_end(&mut rest).unwrap();
        assert!(
            String::from_utf8_lossy(&rest).ends_with("72 of body.\n"),
            "the open connection got its answer, then closed"
        );
        // `b` goes on, on the same workers.
        assert!(get(b.local_addr()).unwrap().contains("Hello from Flick"));
        drop(a);
        assert!(get(b.local_addr()).unwrap().contains("Hello from Flick"));
        assert_eq!(
            b.stats()
                .connections_accepted
                .load(std::sync::atomic::Ordering::Relaxed),
            3
        );
    }

    #[test]
    fn each_service_runs_in_a_group_of_its_weight() {
        let platform = Platform::start(PlatformConfig {
            workers: 2,
            tasks: 4096,
            pin: false,
            ..PlatformConfig::default()
        })
        .unwrap();
        let light = Service::start_on(
            &platform,
            static_web(),
            ServiceConfig {
                weight: 4,
                ..on_free_port()
            },
        )
        .unwrap();
        let plain = Service::start_on(&platform, static_web(), on_free_port()).unwrap();
        let ungrouped = Service::start_on(
            &platform,
            static_web(),
            ServiceConfig {
                weight: 0,
                ..on_free_port()
            },
        )
        .unwrap();
        assert_eq!(platform.groups(), 2, "weight 0 takes no group");
        assert_eq!(
            (light.weight(), plain.weight(), ungrouped.weight()),
            (4, 1, 0)
        );
        for s in [&light, &plain, &ungrouped] {
            for _ in 0..5 {
                assert!(get(s.local_addr()).unwrap().contains("Hello from Flick"));
            }
        }
        assert!(
            light.cpu_charged() > Duration::ZERO,
            "its runs were charged"
        );
        light.set_weight(2);
        assert_eq!(light.weight(), 2);
        assert!(get(light.local_addr())
            .unwrap()
            .contains("Hello from Flick"));
        // A stopped service's group goes once its last task has ended.
        light.stop(Duration::from_secs(5));
        drop(light);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while platform.groups() > 1 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(platform.groups(), 1);
        assert!(get(plain.local_addr())
            .unwrap()
            .contains("Hello from Flick"));
    }

    #[test]
    fn a_new_version_listens_beside_the_old_before_it_stops() {
        let platform = Platform::start(PlatformConfig {
            workers: 2,
            tasks: 4096,
            pin: false,
            ..PlatformConfig::default()
        })
        .unwrap();
        let config = on_free_port();
        let old = Service::start_on(&platform, static_web(), config.clone()).unwrap();
        let new = Service::start_on(&platform, static_web(), config).unwrap();
        assert_eq!(old.local_addr(), new.local_addr());
        old.stop(Duration::from_secs(5));
        for _ in 0..10 {
            assert!(get(new.local_addr()).unwrap().contains("Hello from Flick"));
        }
    }
}
