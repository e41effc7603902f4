//! The Kubernetes client both products build the same way.
//!
//! Every file the client needs goes through [`config_file`]: the kubeconfig (from
//! `--kubeconfig`, `$KUBECONFIG` or `~/.kube/config`) and the files it names for the
//! context in use (`certificate-authority`, `client-certificate`, `client-key`,
//! `tokenFile`). kube-rs would read them with `std::fs` (unbounded, and waiting
//! forever on a FIFO); here they are read, bounded, before kube-rs sees the
//! configuration, which then carries them inline (`*-data`). `tokenFile` stays a file:
//! a layer of ours re-reads it, bounded, at most once a minute, as kube-rs and
//! client-go do for rotating tokens. The in-cluster configuration (service-account
//! token and CA at fixed paths the kubelet writes) is kube-rs's own.

use crate::{Error, config_file};
use http::HeaderValue;
use kube::config::{AuthInfo, Cluster, KubeConfigOptions, Kubeconfig};
use secrecy::SecretString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// A client from `kubeconfig`, else `$KUBECONFIG` or `~/.kube/config`, else the
/// in-cluster configuration (kube-rs's `Config::infer` order).
///
/// Client-side retries are off: every caller watches through [`crate::watch`], which
/// restarts and backs off by itself, and the client's own retries of 5xx answers would
/// only hide an outage from the products' `*_up` metrics and readiness for minutes.
pub async fn client(kubeconfig: Option<&Path>) -> Result<kube::Client, Error> {
    let (mut config, token_file) = match kubeconfig {
        Some(path) => from_files(&[path.to_path_buf()]).await?,
        None => infer().await?,
    };
    config.default_retry = false;
    let builder = kube::client::ClientBuilder::try_from(config)?;
    Ok(match token_file {
        Some(token) => builder.with_layer(&token).build(),
        None => builder.build(),
    })
}

/// kube-rs's `Config::infer`, with the kubeconfig files read bounded: the kubeconfig
/// files of `$KUBECONFIG` (merged, first wins) or `~/.kube/config`; if that fails,
/// the in-cluster configuration; if both fail, both reasons.
async fn infer() -> Result<(kube::Config, Option<TokenFile>), Error> {
    let local = match kubeconfig_paths() {
        Some(paths) => from_files(&paths).await,
        None => Err(Error::NoKubeconfig),
    };
    let (mut config, token) = match local {
        Ok(found) => found,
        Err(kubeconfig) => {
            tracing::trace!(error = %kubeconfig, "no usable kubeconfig; trying the in-cluster configuration");
            let config = kube::Config::incluster().map_err(|in_cluster| Error::NoConfig {
                kubeconfig: Box::new(kubeconfig),
                in_cluster,
            })?;
            (config, None)
        }
    };
    config.apply_debug_overrides();
    Ok((config, token))
}

/// `$KUBECONFIG`'s paths when it names any, else `~/.kube/config` when it exists.
fn kubeconfig_paths() -> Option<Vec<PathBuf>> {
    if let Some(value) = std::env::var_os("KUBECONFIG") {
        let paths: Vec<PathBuf> = std::env::split_paths(&value)
            .filter(|p| !p.as_os_str().is_empty())
            .collect();
        if !paths.is_empty() {
            return Some(paths);
        }
    }
    let default = PathBuf::from(std::env::var_os("HOME")?).join(".kube/config");
    std::fs::symlink_metadata(&default)
        .is_ok()
        .then(|| vec![default])
}

/// The configuration of the current context of these kubeconfig files (merged in
/// order, the first to set a value wins), with the files it names read inline.
async fn from_files(paths: &[PathBuf]) -> Result<(kube::Config, Option<TokenFile>), Error> {
    let mut merged = Kubeconfig::default();
    for path in paths {
        let kubeconfig = read_kubeconfig(path)?;
        merged = merged
            .merge(kubeconfig)
            .map_err(|source| Error::Kubeconfig {
                path: path.clone(),
                source,
            })?;
    }
    let origin = paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(":");
    let token = inline_files(&mut merged, &origin)?;
    let config = kube::Config::from_custom_kubeconfig(merged, &KubeConfigOptions::default())
        .await
        .map_err(|source| Error::Kubeconfig {
            path: PathBuf::from(&origin),
            source,
        })?;
    Ok((config, token))
}

/// One kubeconfig file, bounded, with the relative paths it names made absolute
/// against its folder (as kube-rs and client-go resolve them).
fn read_kubeconfig(path: &Path) -> Result<Kubeconfig, Error> {
    let file_error = |source| Error::KubeconfigFile {
        path: path.to_path_buf(),
        source,
    };
    let bytes = config_file::read(path, config_file::DEFAULT_LIMIT).map_err(file_error)?;
    let text = decode(bytes).map_err(file_error)?;
    let mut kubeconfig = Kubeconfig::from_yaml(&text).map_err(|source| Error::Kubeconfig {
        path: path.to_path_buf(),
        source,
    })?;
    if let Some(dir) = path.parent() {
        let absolute = |file: &mut Option<String>| {
            if let Some(f) = file
                .as_mut()
                .filter(|f| Path::new(f.as_str()).is_relative())
            {
                *f = dir.join(&*f).to_string_lossy().into_owned();
            }
        };
        for cluster in kubeconfig
            .clusters
            .iter_mut()
            .filter_map(|c| c.cluster.as_mut())
        {
            absolute(&mut cluster.certificate_authority);
        }
        for user in kubeconfig
            .auth_infos
            .iter_mut()
            .filter_map(|u| u.auth_info.as_mut())
        {
            absolute(&mut user.client_certificate);
            absolute(&mut user.client_key);
            absolute(&mut user.token_file);
            // An exec plugin named with a separator is a path; a bare name is looked up
            // in PATH (client-go's rule).
            if let Some(exec) = user.exec.as_mut() {
                if exec
                    .command
                    .as_ref()
                    .is_some_and(|c| c.contains(std::path::MAIN_SEPARATOR))
                {
                    absolute(&mut exec.command);
                }
            }
        }
    }
    Ok(kubeconfig)
}

/// Kubeconfig text: UTF-8, with or without a byte-order mark, or UTF-16 with one (as
/// Windows tools write it; kube-rs reads those too).
fn decode(bytes: Vec<u8>) -> Result<String, std::io::Error> {
    let invalid = |what| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
    let utf16 = |rest: &[u8], from: fn([u8; 2]) -> u16| {
        let units: Vec<u16> = rest
            .chunks(2)
            .map(|c| from([c[0], *c.get(1).unwrap_or(&0)]))
            .collect();
        String::from_utf16(&units).map_err(|_| invalid("not UTF-16 text"))
    };
    match bytes.as_slice() {
        [0xFF, 0xFE, rest @ ..] => utf16(rest, u16::from_le_bytes),
        [0xFE, 0xFF, rest @ ..] => utf16(rest, u16::from_be_bytes),
        [0xEF, 0xBB, 0xBF, rest @ ..] => {
            String::from_utf8(rest.to_vec()).map_err(|_| invalid("not UTF-8 text"))
        }
        _ => String::from_utf8(bytes).map_err(|_| invalid("not UTF-8 text")),
    }
}

/// Read the files the current context names into the configuration (`*-data`), each
/// bounded and a regular file. The context's `tokenFile`, when it is the credential
/// kube-rs would use, is read once here (so a bad one stops startup) and returned as a
/// layer that re-reads it; kube-rs no longer sees it. Another context's files are not
/// read (kube-rs would not read them either).
fn inline_files(kubeconfig: &mut Kubeconfig, origin: &str) -> Result<Option<TokenFile>, Error> {
    let Some(context) = kubeconfig
        .current_context
        .as_ref()
        .and_then(|name| kubeconfig.contexts.iter().find(|c| &c.name == name))
        .and_then(|c| c.context.clone())
    else {
        // kube-rs says what is missing.
        return Ok(None);
    };
    let read = |key: &'static str, file: &str, limit: u64| {
        config_file::read(Path::new(file), limit).map_err(|source| Error::KubeconfigReference {
            kubeconfig: origin.to_string(),
            key,
            path: PathBuf::from(file),
            source,
        })
    };
    use base64::Engine;
    let encode = |bytes: Vec<u8>| base64::engine::general_purpose::STANDARD.encode(bytes);
    if let Some(cluster) = kubeconfig
        .clusters
        .iter_mut()
        .find(|c| c.name == context.cluster)
        .and_then(|c| c.cluster.as_mut())
    {
        let Cluster {
            certificate_authority: file,
            certificate_authority_data: data,
            ..
        } = cluster;
        // Inline data wins over a file, in kube-rs as in client-go.
        if let Some(file) = file.take().filter(|_| data.is_none()) {
            *data = Some(encode(read(
                "certificate-authority",
                &file,
                config_file::DEFAULT_LIMIT,
            )?));
        }
    }
    let Some(user) = context.user.as_ref().and_then(|name| {
        kubeconfig
            .auth_infos
            .iter_mut()
            .find(|u| &u.name == name)
            .and_then(|u| u.auth_info.as_mut())
    }) else {
        return Ok(None);
    };
    if let Some(file) = user
        .client_certificate
        .take()
        .filter(|_| user.client_certificate_data.is_none())
    {
        user.client_certificate_data = Some(encode(read(
            "client-certificate",
            &file,
            config_file::DEFAULT_LIMIT,
        )?));
    }
    if let Some(file) = user
        .client_key
        .take()
        .filter(|_| user.client_key_data.is_none())
    {
        let key = read("client-key", &file, config_file::DEFAULT_LIMIT)?;
        user.client_key_data = Some(SecretString::from(encode(key)));
    }
    // kube-rs's order of credentials: auth-provider, basic, token, tokenFile, exec.
    if user.token_file.is_none() || takes_precedence_over_token_file(user) {
        return Ok(None);
    }
    let Some(file) = user.token_file.take() else {
        return Ok(None);
    };
    // A token file outranks an exec plugin: kube-rs would not run it.
    user.exec = None;
    let path = PathBuf::from(file);
    let header = TokenFile::read(&path).map_err(|source| Error::KubeconfigReference {
        kubeconfig: origin.to_string(),
        key: "tokenFile",
        path: path.clone(),
        source,
    })?;
    Ok(Some(TokenFile {
        path: Arc::from(path),
        state: Arc::new(Mutex::new((header, Instant::now()))),
    }))
}

fn takes_precedence_over_token_file(user: &AuthInfo) -> bool {
    user.auth_provider.is_some()
        || (user.username.is_some() && user.password.is_some())
        || user.token.is_some()
}

/// How long a token read from a file is used before it is read again (kube-rs's and
/// client-go's minute, for tokens the kubelet or a sidecar rotates).
const TOKEN_REREAD: Duration = Duration::from_secs(60);

/// A kubeconfig's `tokenFile`, re-read at most every [`TOKEN_REREAD`] through the
/// bounded reader; a re-read that fails keeps the last token (kubernetes#68164: a
/// file may be removed after start) and is logged. A tower layer: it sets each
/// request's `Authorization` header.
#[derive(Clone)]
struct TokenFile {
    path: Arc<Path>,
    state: Arc<Mutex<(HeaderValue, Instant)>>,
}

impl TokenFile {
    fn read(path: &Path) -> Result<HeaderValue, std::io::Error> {
        let token = config_file::read_to_string(path, config_file::SECRET_LIMIT)?;
        let mut header =
            HeaderValue::try_from(format!("Bearer {}", token.trim())).map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "the token holds characters an HTTP header cannot",
                )
            })?;
        header.set_sensitive(true);
        Ok(header)
    }

    fn header(&self) -> HeaderValue {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.1.elapsed() >= TOKEN_REREAD {
            match Self::read(&self.path) {
                Ok(header) => state.0 = header,
                Err(error) => {
                    tracing::warn!(path = %self.path.display(), %error, "the kubeconfig's tokenFile cannot be read again; the last token is used")
                }
            }
            state.1 = Instant::now();
        }
        state.0.clone()
    }
}

impl<S> tower::Layer<S> for TokenFile {
    type Service = WithToken<S>;

    fn layer(&self, inner: S) -> WithToken<S> {
        WithToken {
            inner,
            token: self.clone(),
        }
    }
}

/// A service whose requests carry the token of a [`TokenFile`].
pub struct WithToken<S> {
    inner: S,
    token: TokenFile,
}

impl<S, B> tower::Service<http::Request<B>> for WithToken<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> S::Future {
        request
            .headers_mut()
            .insert(http::header::AUTHORIZATION, self.token.header());
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_kubeconfig_that_does_not_load_names_its_path() {
        let missing = Path::new("/nonexistent/kubeconfig");
        let Err(e) = client(Some(missing)).await else {
            panic!("a missing kubeconfig made a client");
        };
        assert!(matches!(e, Error::KubeconfigFile { .. }), "{e:?}");
        assert!(e.to_string().contains("/nonexistent/kubeconfig"), "{e}");
    }

    fn mkfifo(path: &Path) {
        let made = std::process::Command::new("mkfifo")
            .arg(path)
            .status()
            .expect("mkfifo");
        assert!(made.success());
    }

    /// `client(path)`, which must answer within 5 s. On a thread of its own: a read
    /// that blocks on a FIFO blocks its runtime too, so only a thread can time it out.
    fn promptly(path: &Path) -> Result<kube::Client, Error> {
        let (tx, rx) = std::sync::mpsc::channel();
        let owned = path.to_path_buf();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            let _ = tx.send(runtime.block_on(client(Some(&owned))));
        });
        rx.recv_timeout(Duration::from_secs(5))
            .unwrap_or_else(|_| panic!("client({path:?}) did not answer within 5 s"))
    }

    /// `--kubeconfig /dev/zero` or a FIFO fails at once, naming the path, instead of
    /// growing without end or blocking startup.
    #[test]
    fn a_kubeconfig_that_is_not_a_regular_file_is_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let fifo = dir.path().join("fifo");
        mkfifo(&fifo);
        for (path, says) in [
            (Path::new("/dev/zero"), "a character device"),
            (fifo.as_path(), "a FIFO"),
        ] {
            let Err(e) = promptly(path) else {
                panic!("{path:?} made a client");
            };
            assert!(matches!(e, Error::KubeconfigFile { .. }), "{e:?}");
            assert!(e.to_string().contains(says), "{e}");
            assert!(e.to_string().contains(&path.display().to_string()), "{e}");
        }
    }

    const PEM: &str = "-----BEGIN CERTIFICATE-----\nMA==\n-----END CERTIFICATE-----\n";

    /// A kubeconfig naming `file` under `key` for the context's cluster or user, with
    /// the other referenced files valid, written beside it.
    fn kubeconfig_naming(dir: &Path, key: &str, file: &str) -> PathBuf {
        std::fs::write(dir.join("ok.pem"), PEM).expect("write pem");
        std::fs::write(dir.join("ok.token"), "t\n").expect("write token");
        let pick = |k: &str, ok: &str| {
            if k == key {
                file.to_string()
            } else {
                ok.to_string()
            }
        };
        let (ca, cert, key_file) = (
            pick("certificate-authority", "ok.pem"),
            pick("client-certificate", "ok.pem"),
            pick("client-key", "ok.pem"),
        );
        let user = if key == "tokenFile" {
            format!("{{tokenFile: '{file}'}}")
        } else {
            format!("{{client-certificate: '{cert}', client-key: '{key_file}'}}")
        };
        let path = dir.join(format!("kubeconfig-{key}"));
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
                 clusters: [{{name: k, cluster: {{server: 'https://127.0.0.1:1', certificate-authority: '{ca}'}}}}]\n\
                 users: [{{name: u, user: {user}}}]\n\
                 contexts: [{{name: c, context: {{cluster: k, user: u}}}}]\n"
            ),
        )
        .expect("write kubeconfig");
        path
    }

    /// Each file a kubeconfig names is read through the bounded reader: a FIFO, a
    /// link to /dev/zero or a file past the limit fails at once, naming the
    /// kubeconfig, the key and the file (kube-rs read them with `std::fs`: the FIFO
    /// blocked client construction for good and /dev/zero grew without end).
    #[test]
    fn every_file_a_kubeconfig_names_is_bounded_and_regular() {
        let dir = tempfile::tempdir().expect("temp dir");
        let fifo = dir.path().join("fifo");
        mkfifo(&fifo);
        let zero = dir.path().join("zero");
        std::os::unix::fs::symlink("/dev/zero", &zero).expect("link to /dev/zero");
        let huge = dir.path().join("huge");
        let big = std::fs::File::create(&huge).expect("create");
        big.set_len(config_file::DEFAULT_LIMIT + 1).expect("grow");
        for key in [
            "certificate-authority",
            "client-certificate",
            "client-key",
            "tokenFile",
        ] {
            for (file, says) in [
                ("fifo", "a FIFO"),
                ("zero", "a character device"),
                ("huge", "bytes allowed"),
            ] {
                let kubeconfig = kubeconfig_naming(dir.path(), key, file);
                let Err(e) = promptly(&kubeconfig) else {
                    panic!("{key} {file} made a client");
                };
                let text = e.to_string();
                let named = dir.path().join(file).display().to_string();
                assert!(matches!(e, Error::KubeconfigReference { .. }), "{e:?}");
                assert!(
                    text.contains(key) && text.contains(&named) && text.contains(says),
                    "{key} {file}: {text}"
                );
                assert!(text.contains(&kubeconfig.display().to_string()), "{text}");
            }
        }
    }

    #[tokio::test]
    async fn a_kubeconfig_file_is_used_as_given() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("kubeconfig");
        std::fs::write(
            &path,
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
             clusters: [{name: k, cluster: {server: 'http://127.0.0.1:1'}}]\n\
             users: [{name: u, user: {token: t}}]\n\
             contexts: [{name: c, context: {cluster: k, user: u, namespace: gpu-team}}]\n",
        )
        .expect("write kubeconfig");
        let client = client(Some(&path)).await.expect("client from the file");
        assert_eq!(client.default_namespace(), "gpu-team");
    }

    /// The files named relative to the kubeconfig are found beside it and carried
    /// inline; another context's missing files are not read.
    #[tokio::test]
    async fn relative_files_are_read_beside_the_kubeconfig_and_inlined() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("token"), "secret-token\n").expect("token");
        let path = dir.path().join("kubeconfig");
        std::fs::write(
            &path,
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
             clusters: [{name: k, cluster: {server: 'http://127.0.0.1:1'}},\n\
                        {name: other, cluster: {server: 'https://x', certificate-authority: /nonexistent/ca}}]\n\
             users: [{name: u, user: {tokenFile: token}},\n\
                     {name: o, user: {client-key: /nonexistent/key}}]\n\
             contexts: [{name: c, context: {cluster: k, user: u}},\n\
                        {name: d, context: {cluster: other, user: o}}]\n",
        )
        .expect("write kubeconfig");
        let mut kubeconfig = read_kubeconfig(&path).expect("kubeconfig");
        let token = inline_files(&mut kubeconfig, "kubeconfig")
            .expect("the current context's files")
            .expect("a token file");
        assert_eq!(&*token.path, dir.path().join("token"));
        assert_eq!(token.header(), "Bearer secret-token");
        let user = kubeconfig.auth_infos[0].auth_info.as_ref().expect("user");
        assert!(user.token_file.is_none(), "kube-rs must not read it again");
        client(Some(&path)).await.expect("a client");
    }

    /// Real PEM files named relative to the kubeconfig make a client: kube-rs parses the
    /// inlined CA, certificate and key as it parsed the files.
    #[test]
    fn a_kubeconfig_with_certificate_files_makes_a_client() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_key = rcgen::KeyPair::generate().expect("CA key");
        let ca = rcgen::CertifiedIssuer::self_signed(ca, ca_key).expect("CA");
        let client_key = rcgen::KeyPair::generate().expect("client key");
        let client = rcgen::CertificateParams::new(Vec::<String>::new())
            .expect("client params")
            .signed_by(&client_key, &ca)
            .expect("client certificate");
        std::fs::create_dir(dir.path().join("pki")).expect("pki dir");
        for (name, pem) in [
            ("ca.crt", ca.pem()),
            ("client.crt", client.pem()),
            ("client.key", client_key.serialize_pem()),
        ] {
            std::fs::write(dir.path().join("pki").join(name), pem).expect("write pem");
        }
        let path = dir.path().join("kubeconfig");
        std::fs::write(
            &path,
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
             clusters: [{name: k, cluster: {server: 'https://127.0.0.1:1', certificate-authority: pki/ca.crt}}]\n\
             users: [{name: u, user: {client-certificate: pki/client.crt, client-key: pki/client.key}}]\n\
             contexts: [{name: c, context: {cluster: k, user: u}}]\n",
        )
        .expect("write kubeconfig");
        promptly(&path).expect("a client from certificate files");
        // The same kubeconfig with the key truncated: kube-rs refuses what was inlined.
        std::fs::write(
            dir.path().join("pki/client.key"),
            "-----BEGIN PRIVATE KEY-----\n",
        )
        .expect("truncate key");
        assert!(promptly(&path).is_err());
    }

    /// Requests carry the token of the kubeconfig's `tokenFile`: a one-request HTTP
    /// server records the `Authorization` header the client sends.
    #[tokio::test]
    async fn requests_carry_the_token_files_token() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("token"), "rotating-token\n").expect("token");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("address").port();
        let path = dir.path().join("kubeconfig");
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
                 clusters: [{{name: k, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n\
                 users: [{{name: u, user: {{tokenFile: token}}}}]\n\
                 contexts: [{{name: c, context: {{cluster: k, user: u}}}}]\n"
            ),
        )
        .expect("write kubeconfig");
        let server = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.expect("accept");
            let mut request = Vec::new();
            let mut buf = [0u8; 4096];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = conn.read(&mut buf).await.expect("read");
                assert!(n > 0, "the request ended early");
                request.extend_from_slice(&buf[..n]);
            }
            conn.write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}",
            )
            .await
            .expect("answer");
            String::from_utf8_lossy(&request).to_lowercase()
        });
        let client = client(Some(&path)).await.expect("a client");
        let request = http::Request::get("/version")
            .body(Vec::new())
            .expect("request");
        client.request_text(request).await.expect("an answer");
        let request = server.await.expect("server");
        assert!(
            request.contains("\r\nauthorization: bearer rotating-token\r\n"),
            "{request}"
        );
    }

    /// A token file is read again after a minute, as it rotates; a re-read that fails
    /// keeps the last token.
    #[test]
    fn a_token_file_is_read_again_when_stale_and_kept_when_it_cannot_be() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("token");
        std::fs::write(&path, "one").expect("token");
        let token = TokenFile {
            path: Arc::from(path.as_path()),
            state: Arc::new(Mutex::new((
                TokenFile::read(&path).expect("token"),
                Instant::now(),
            ))),
        };
        std::fs::write(&path, "two").expect("token");
        assert_eq!(token.header(), "Bearer one", "fresh: not read again");
        let stale = |t: &TokenFile| {
            t.state.lock().expect("lock").1 = Instant::now() - TOKEN_REREAD;
        };
        stale(&token);
        assert_eq!(token.header(), "Bearer two");
        std::fs::remove_file(&path).expect("remove");
        mkfifo(&path);
        stale(&token);
        assert_eq!(token.header(), "Bearer two", "a FIFO keeps the last token");
    }
}
