//! Binding the listening socket, shared by both binaries so `:PORT` means the same
//! everywhere: every interface, IPv4 and IPv6 (one IPv6 socket that also accepts
//! IPv4-mapped connections), as Go's `net.Listen` gives dcgm-exporter. A host without
//! IPv6 falls back to IPv4 only, and says so. An explicit host keeps its meaning:
//! `0.0.0.0:9400` is IPv4 only, `[::1]:9400` IPv6 only.

use socket2::{Domain, Protocol, Socket, Type};
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use tokio::net::TcpListener;

/// The accept queue length, as Go's and tokio's listeners use on Linux.
const BACKLOG: i32 = 1024;

/// How `address` is to be bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddress {
    /// `:PORT`: every interface, both address families where the host has IPv6.
    AnyHost(u16),
    /// `HOST:PORT` or `[V6]:PORT`: exactly that (a name binds to what it resolves to).
    Exact(String),
}

impl ListenAddress {
    /// Read `HOST:PORT`, `[IPv6]:PORT` or `:PORT`.
    pub fn parse(address: &str) -> Result<ListenAddress, BadAddress> {
        match address.strip_prefix(':') {
            Some(port) => port
                .parse::<u16>()
                .map(ListenAddress::AnyHost)
                .map_err(|_| BadAddress(address.to_string())),
            None => Ok(ListenAddress::Exact(address.to_string())),
        }
    }
}

/// A listen address whose port is not 0-65535.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?}: expected :PORT, HOST:PORT or [IPv6]:PORT with a port 0-65535")]
pub struct BadAddress(String);

/// Bind `address` (see [`ListenAddress`]) for [`crate::serve`].
pub async fn bind(address: &str) -> io::Result<TcpListener> {
    let parsed = ListenAddress::parse(address)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    match parsed {
        ListenAddress::Exact(exact) => TcpListener::bind(exact).await,
        ListenAddress::AnyHost(port) => match bind_dual_stack(port) {
            Ok(listener) => Ok(listener),
            // Not IPv6's fault: the IPv4 socket would fail the same way.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::AddrInUse | io::ErrorKind::PermissionDenied
                ) =>
            {
                Err(e)
            }
            Err(e) => {
                tracing::warn!(port, error = %e, "no IPv6 on this host: listening on IPv4 only");
                TcpListener::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port))).await
            }
        },
    }
}

/// One `[::]:port` socket with IPV6_V6ONLY off: IPv6 and IPv4-mapped connections.
fn bind_dual_stack(port: u16) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::IPV6, Type::STREAM, Some(Protocol::TCP))?;
    socket.set_only_v6(false)?;
    // As tokio's own bind: a restart need not wait out the old connections' TIME_WAIT.
    socket.set_reuse_address(true)?;
    socket.bind(&SocketAddr::from((Ipv6Addr::UNSPECIFIED, port)).into())?;
    socket.listen(BACKLOG)?;
    socket.set_nonblocking(true)?;
    TcpListener::from_std(socket.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn only_a_leading_colon_means_every_interface() {
        assert_eq!(
            ListenAddress::parse(":9400"),
            Ok(ListenAddress::AnyHost(9400))
        );
        assert_eq!(ListenAddress::parse(":0"), Ok(ListenAddress::AnyHost(0)));
        for exact in ["0.0.0.0:9400", "[::1]:9400", "[::]:9400", "localhost:9400"] {
            assert_eq!(
                ListenAddress::parse(exact),
                Ok(ListenAddress::Exact(exact.into()))
            );
        }
        let e = ListenAddress::parse(":94000").unwrap_err().to_string();
        assert!(e.contains(":94000"), "{e}");
        assert!(ListenAddress::parse(":").is_err());
    }

    /// Connect to `addr`, send a byte, and read it back through `listener`.
    async fn reaches(listener: &TcpListener, addr: SocketAddr) -> bool {
        let Ok(mut client) = tokio::net::TcpStream::connect(addr).await else {
            return false;
        };
        let (mut server, _) = listener.accept().await.expect("accept");
        client.write_all(b"x").await.expect("write");
        let mut b = [0u8; 1];
        server.read_exact(&mut b).await.expect("read");
        b == *b"x"
    }

    fn host_has_ipv6_loopback() -> bool {
        std::net::TcpListener::bind("[::1]:0").is_ok()
    }

    #[tokio::test]
    async fn any_host_answers_on_ipv4_and_ipv6() {
        let listener = bind(":0").await.expect("bind");
        let port = listener.local_addr().expect("local").port();
        assert!(reaches(&listener, (Ipv4Addr::LOCALHOST, port).into()).await);
        if host_has_ipv6_loopback() {
            assert!(reaches(&listener, (Ipv6Addr::LOCALHOST, port).into()).await);
        }
    }

    #[tokio::test]
    async fn an_explicit_address_stays_single_stack() {
        let v4 = bind("127.0.0.1:0").await.expect("bind v4");
        let port = v4.local_addr().expect("local").port();
        assert!(reaches(&v4, (Ipv4Addr::LOCALHOST, port).into()).await);
        if host_has_ipv6_loopback() {
            assert!(!reaches(&v4, (Ipv6Addr::LOCALHOST, port).into()).await);
            let v6 = bind("[::1]:0").await.expect("bind v6");
            let port = v6.local_addr().expect("local").port();
            assert!(reaches(&v6, (Ipv6Addr::LOCALHOST, port).into()).await);
            assert!(!reaches(&v6, (Ipv4Addr::LOCALHOST, port).into()).await);
        }
    }
}
