//! systemd's readiness protocol (`sd_notify`): with `Type=notify`, the
//! service manager waits for `READY=1` before it counts `flick run` as
//! started, and `STOPPING=1` says a drain has begun. The manager passes a
//! datagram socket in `$NOTIFY_SOCKET`; without it (not under systemd)
//! every call does nothing.

use std::os::unix::net::UnixDatagram;

/// Sends `state` (such as `READY=1`) to the service manager, if there is
/// one. Failures are returned for the caller to log; they never stop the
/// service.
pub fn notify(state: &str) -> std::io::Result<bool> {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(false);
    };
    let sock = UnixDatagram::unbound()?;
    let bytes = path.as_encoded_bytes();
    if let Some(name) = bytes.strip_prefix(b"@") {
        // An abstract socket: its name has no file behind it.
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
        sock.send_to_addr(state.as_bytes(), &addr)?;
    } else {
        sock.send_to(state.as_bytes(), &path)?;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_the_state_to_the_socket_named_in_the_environment() {
        let dir = std::env::temp_dir().join(format!("flick-notify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify.sock");
        let manager = UnixDatagram::bind(&path).unwrap();
        // The only test in this binary that sets the variable.
        std::env::set_var("NOTIFY_SOCKET", &path);
        assert!(notify("READY=1").unwrap());
        std::env::remove_var("NOTIFY_SOCKET");
        let mut buf = [0u8; 64];
        let n = manager.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
        assert!(!notify("READY=1").unwrap(), "no manager, nothing sent");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
