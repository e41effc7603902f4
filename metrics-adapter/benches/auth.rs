//! What authentication and authorization add to a request on the cached path (issue 6).
//!
//! The real middleware (`auth::middleware`) in front of a handler that answers at once,
//! against the baseline of the same router without it, in the same process. Every
//! review is answered once by the fake API server (kube-sim) before measuring, so each
//! measured request takes the cached path the HPA's steady polling takes: per-request
//! certificate verification (as k8s.io/apiserver does it, against the current CAs),
//! header handling, a TokenReview cache hit where a token is used, and a
//! SubjectAccessReview cache hit.
//!
//! `cargo bench -p gpu-metrics-adapter --bench auth`

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use axum::routing::get;
use criterion::{Criterion, criterion_group, criterion_main};
use gpu_metrics_adapter::auth::{self, AuthSettings, authn::FlagSources};
use k8s_openapi::api::authentication::v1::UserInfo;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube_sim::FakeApiServer;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use rustls_pki_types::CertificateDer;
use tls_serving::PeerCertificates;
use tower::ServiceExt;

const PATH: &str =
    "/apis/custom.metrics.k8s.io/v1beta2/namespaces/inference/pods/*/gpu_utilization";

fn ca(cn: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.distinguished_name.push(DnType::CommonName, cn);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    CertifiedIssuer::self_signed(params, KeyPair::generate().expect("key")).expect("CA")
}

fn client_cert(issuer: &CertifiedIssuer<'static, KeyPair>, cn: &str) -> CertificateDer<'static> {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.distinguished_name.push(DnType::CommonName, cn);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let key = KeyPair::generate().expect("key");
    params.signed_by(&key, issuer).expect("leaf").der().clone()
}

fn request(peer: Option<&CertificateDer<'static>>, headers: &[(&str, &str)]) -> Request<Body> {
    let mut builder = Request::get(PATH);
    for (k, v) in headers {
        builder = builder.header(*k, *v);
    }
    let mut request = builder.body(Body::empty()).expect("request");
    let chain: Arc<[CertificateDer<'static>]> = peer.into_iter().cloned().collect();
    request.extensions_mut().insert(PeerCertificates(chain));
    request
}

/// (name, router, client certificate, request headers).
type Case<'a> = (
    &'a str,
    &'a axum::Router,
    Option<&'a CertificateDer<'static>>,
    Vec<(&'a str, &'a str)>,
);

fn bench(c: &mut Criterion) {
    tls_serving::install_crypto_provider();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let api = FakeApiServer::start().expect("fake API server");
    let front_proxy_ca = ca("front-proxy-ca");
    let client_ca = ca("client-ca");
    api.apply_config_map(ConfigMap {
        metadata: ObjectMeta {
            name: Some("extension-apiserver-authentication".into()),
            namespace: Some("kube-system".into()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([
            ("client-ca-file".to_string(), client_ca.pem()),
            (
                "requestheader-client-ca-file".to_string(),
                front_proxy_ca.pem(),
            ),
            (
                "requestheader-allowed-names".to_string(),
                r#"["front-proxy-client"]"#.to_string(),
            ),
        ])),
        ..ConfigMap::default()
    });
    api.set_token_user(
        "token",
        UserInfo {
            username: Some("carol".into()),
            ..UserInfo::default()
        },
    );
    api.set_authorizer(|_| true);
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).expect("kubeconfig");

    let front_proxy = client_cert(&front_proxy_ca, "front-proxy-client");
    let alice = client_cert(&client_ca, "alice");

    let auth = runtime.block_on(async {
        let kc = kube::config::Kubeconfig::read_from(&kubeconfig).expect("read kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .expect("config");
        let client = kube::Client::try_from(config).expect("client");
        auth::Auth::start(
            AuthSettings {
                sources: FlagSources::default(),
                skip_lookup: false,
                tolerate_lookup_failure: false,
                anonymous: true,
                // Long enough that nothing expires while measuring.
                token_cache_ttl: Duration::from_secs(3600),
                authorized_ttl: Duration::from_secs(3600),
                unauthorized_ttl: Duration::from_secs(3600),
                always_allow_paths: vec!["/healthz".into()],
                metrics: Default::default(),
            },
            client.clone(),
            client,
        )
        .await
        .expect("auth")
    });
    let plain = axum::Router::new().route(
        "/apis/custom.metrics.k8s.io/v1beta2/namespaces/{ns}/pods/{name}/{metric}",
        get(|| async { "ok" }),
    );
    let guarded = plain
        .clone()
        .layer(axum::middleware::from_fn_with_state(auth, auth::middleware));

    let hpa = [
        (
            "X-Remote-User",
            "system:serviceaccount:kube-system:horizontal-pod-autoscaler",
        ),
        ("X-Remote-Group", "system:serviceaccounts"),
        ("X-Remote-Group", "system:serviceaccounts:kube-system"),
    ];
    let masters = [
        ("X-Remote-User", "system:kube-aggregator"),
        ("X-Remote-Group", "system:masters"),
    ];
    let cases: Vec<Case> = vec![
        ("baseline_no_auth", &plain, None, vec![]),
        (
            "front_proxy_hpa_sar_cached",
            &guarded,
            Some(&front_proxy),
            hpa.to_vec(),
        ),
        (
            "front_proxy_system_masters",
            &guarded,
            Some(&front_proxy),
            masters.to_vec(),
        ),
        ("client_cert_sar_cached", &guarded, Some(&alice), vec![]),
        (
            "bearer_token_both_cached",
            &guarded,
            None,
            vec![("Authorization", "Bearer token")],
        ),
    ];
    // Warm the caches, and prove every case is allowed.
    for (name, router, peer, headers) in &cases {
        let status = runtime
            .block_on((*router).clone().oneshot(request(*peer, headers)))
            .expect("infallible")
            .status();
        assert_eq!(status, 200, "{name}");
    }
    let mut group = c.benchmark_group("auth");
    for (name, router, peer, headers) in &cases {
        group.bench_function(*name, |b| {
            b.iter(|| {
                runtime
                    .block_on((*router).clone().oneshot(request(*peer, headers)))
                    .expect("infallible")
            })
        });
    }
    group.finish();
    let reviews = api.access_reviews().len();
    assert!(
        reviews <= cases.len(),
        "the measured path must be cached: {reviews} reviews"
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
