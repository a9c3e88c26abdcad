//! The test server's TLS ([`super::KubeApi::serve_tls`]): a certificate for 127.0.0.1 and
//! localhost signed by a test CA, both written by `tls/generate.sh` (test material: the key is
//! in the repository), and a listener that hands axum the connections it has shaken hands with.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::rustls;
use tokio_rustls::server::TlsStream;

use super::{lock, KubeApi};

/// The CA that signed the server's certificate, as a kubeconfig's `certificate-authority-data`
/// holds it (decoded).
pub const CA_PEM: &str = include_str!("tls/ca.pem");
const CERT_PEM: &str = include_str!("tls/server.pem");
const KEY_PEM: &str = include_str!("tls/server.key");

/// The server's TLS: its certificate chain and key, ALPN `h2` then `http/1.1`.
fn server_config() -> Arc<rustls::ServerConfig> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_slice_iter(CERT_PEM.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .expect("the test server's certificate");
    let key = PrivateKeyDer::from_pem_slice(KEY_PEM.as_bytes()).expect("the test server's key");
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .expect("the test server's certificate and key");
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Arc::new(config)
}

/// Listens on 127.0.0.1:0; each connection's handshake runs apart, so that a slow or failed
/// one holds up no other, and axum gets the connections whose handshake succeeded.
pub struct Listener {
    pub addr: SocketAddr,
    ready: mpsc::Receiver<(Breakable, SocketAddr)>,
}

impl Listener {
    /// Binds, and records each connection accepted in `api` (its peer), breakable by
    /// [`KubeApi::close_connections`].
    pub async fn bind(api: KubeApi) -> Listener {
        let tcp = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = tcp.local_addr().expect("local_addr");
        let acceptor = tokio_rustls::TlsAcceptor::from(server_config());
        let (sender, ready) = mpsc::channel(64);
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    accepted = tcp.accept() => accepted,
                    _ = sender.closed() => return,
                };
                let Ok((stream, peer)) = accepted else {
                    continue;
                };
                lock(&api.inner.accepted).push(peer);
                let mut closing = api.inner.closing.subscribe();
                let broken = Box::pin(async move {
                    let _ = closing.changed().await;
                });
                let (acceptor, sender) = (acceptor.clone(), sender.clone());
                tokio::spawn(async move {
                    if let Ok(io) = acceptor.accept(stream).await {
                        let io = Breakable {
                            io,
                            broken,
                            is_broken: false,
                        };
                        let _ = sender.send((io, peer)).await;
                    }
                });
            }
        });
        Listener { addr, ready }
    }
}

/// A TLS connection that fails every read and write once [`KubeApi::close_connections`] is
/// called, whereupon the server drops it.
pub struct Breakable {
    io: TlsStream<TcpStream>,
    broken: Pin<Box<dyn Future<Output = ()> + Send>>,
    is_broken: bool,
}

impl Breakable {
    fn broken(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.is_broken && self.broken.as_mut().poll(cx).is_ready() {
            self.is_broken = true;
        }
        self.is_broken
    }
}

impl AsyncRead for Breakable {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.broken(cx) {
            return Poll::Ready(Err(std::io::ErrorKind::ConnectionReset.into()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Breakable {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.broken(cx) {
            return Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into()));
        }
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if self.broken(cx) {
            return Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into()));
        }
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if self.broken(cx) {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl axum::serve::Listener for Listener {
    type Io = Breakable;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(accepted) => accepted,
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.addr)
    }
}

/// How a served connection is asked to say GOAWAY ([`KubeApi::go_away`]): it answers on the
/// sender it is given once it has.
pub type GoAway = mpsc::UnboundedSender<tokio::sync::oneshot::Sender<()>>;

/// Serves `app` on the connections `listener` hands over, HTTP/1.1 or HTTP/2 (hyper's auto
/// builder, as `axum::serve`; the peer's address as `ConnectInfo`), until `stopped` turns
/// true: then each connection shuts down as a server's does (GOAWAY, its streams ended by
/// `app`), and this returns once all have closed. Unlike `axum::serve`, a connection says
/// GOAWAY when asked ([`KubeApi::go_away`]) while the others are served on, and allows the
/// streams [`KubeApi::limit_streams_per_connection`] sets.
pub async fn serve(
    mut listener: Listener,
    app: axum::Router,
    api: KubeApi,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let (io, peer) = tokio::select! {
            accepted = axum::serve::Listener::accept(&mut listener) => accepted,
            _ = stopped.wait_for(|s| *s) => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let (asked, going_away) = mpsc::unbounded_channel();
        lock(&api.inner.going_away).push(asked);
        let streams = *lock(&api.inner.streams_per_connection);
        connections.spawn(connection(
            io,
            peer,
            app.clone(),
            streams,
            going_away,
            stopped.clone(),
        ));
    }
    while connections.join_next().await.is_some() {}
}

/// Serves one connection until it closes.
async fn connection(
    io: Breakable,
    peer: SocketAddr,
    app: axum::Router,
    streams: Option<u32>,
    mut going_away: mpsc::UnboundedReceiver<tokio::sync::oneshot::Sender<()>>,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
    use tower::ServiceExt as _;
    let app = app.map_request(
        move |mut request: axum::http::Request<hyper::body::Incoming>| {
            request
                .extensions_mut()
                .insert(axum::extract::ConnectInfo(peer));
            request
        },
    );
    let service = hyper_util::service::TowerToHyperService::new(app);
    let mut builder =
        hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
    if let Some(streams) = streams {
        builder.http2().max_concurrent_streams(streams);
    }
    let served = builder.serve_connection_with_upgrades(hyper_util::rt::TokioIo::new(io), service);
    tokio::pin!(served);
    let mut stopping = false;
    loop {
        tokio::select! {
            _ = served.as_mut() => return,
            Some(said) = going_away.recv() => {
                served.as_mut().graceful_shutdown();
                let _ = said.send(());
            }
            _ = stopped.wait_for(|s| *s), if !stopping => {
                stopping = true;
                served.as_mut().graceful_shutdown();
            }
        }
    }
}
