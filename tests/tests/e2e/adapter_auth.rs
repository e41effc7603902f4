//! The adapter as an aggregated API server: TLS, and authentication and authorization
//! exactly as k8s.io/apiserver's delegated auth does it. Certificates are made here
//! (rcgen); the fake API server holds the `extension-apiserver-authentication`
//! ConfigMap and answers TokenReviews and SubjectAccessReviews from a test policy, and
//! records each review, so that the attributes and identities the adapter sends are
//! checked exactly.

use e2e_tests::https::HttpsClient;
use e2e_tests::pki::{Ca, Leaf};
use e2e_tests::{Adapter, Exporter, KubeNode, attributed_exporter, scratch_dir, wait_for};
use k8s_openapi::api::authentication::v1::UserInfo;
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReviewSpec};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

const SCENARIO: &str = "tests/fixtures/pods-node.toml";
const HPA_USER: &str = "system:serviceaccount:kube-system:horizontal-pod-autoscaler";
const PODS_METRIC: &str =
    "/apis/custom.metrics.k8s.io/v1beta2/namespaces/inference/pods/*/gpu_utilization";
const EXTERNAL_METRIC: &str = "/apis/external.metrics.k8s.io/v1beta1/namespaces/inference/gpu_utilization?labelSelector=app%3Dresnet-inference";
const GOOD_TOKEN: &str = "carols-token";

/// The cluster's certificate authorities and the identities they issued.
struct Pki {
    dir: PathBuf,
    serving_ca: Ca,
    front_proxy_ca: Ca,
    client_ca: Ca,
    /// The aggregator's client certificate.
    front_proxy: Leaf,
    /// From the front-proxy CA, but with a CN not in the allowed names.
    front_proxy_wrong_cn: Leaf,
    /// CN front-proxy-client, from a CA nobody trusts.
    front_proxy_wrong_ca: Leaf,
    /// CN front-proxy-client from the front-proxy CA, but for server authentication
    /// only: not a client certificate.
    front_proxy_server_only: Leaf,
    /// A user's client certificate from the client CA: alice in team-a.
    alice: Leaf,
    /// Another, whom the policy does not allow.
    mallory: Leaf,
}

impl Pki {
    fn new(test: &str) -> Pki {
        let dir = scratch_dir(test);
        let serving_ca = Ca::new("serving-ca");
        let front_proxy_ca = Ca::new("front-proxy-ca");
        let client_ca = Ca::new("client-ca");
        let rogue = Ca::new("front-proxy-ca");
        let pki = Pki {
            front_proxy: front_proxy_ca.client("front-proxy-client", &[]),
            front_proxy_wrong_cn: front_proxy_ca.client("someone-else", &[]),
            front_proxy_wrong_ca: rogue.client("front-proxy-client", &[]),
            front_proxy_server_only: front_proxy_ca.server_only("front-proxy-client"),
            alice: client_ca.client("alice", &["team-a"]),
            mallory: client_ca.client("mallory", &[]),
            dir,
            serving_ca,
            front_proxy_ca,
            client_ca,
        };
        pki.serving_ca
            .server(&["localhost", "127.0.0.1"])
            .write(&pki.dir, "serving");
        pki
    }

    fn serving_flags(&self) -> Vec<String> {
        vec![
            format!("--tls-cert-file={}", self.dir.join("serving.crt").display()),
            format!(
                "--tls-private-key-file={}",
                self.dir.join("serving.key").display()
            ),
        ]
    }

    fn client(&self, identity: Option<&Leaf>) -> HttpsClient {
        HttpsClient::new(&self.serving_ca.pem(), identity)
    }
}

/// The ConfigMap the kube-apiserver publishes, with `front_proxy_ca` as the
/// request-header CA.
fn auth_config_map(pki: &Pki, front_proxy_ca_pem: &str) -> ConfigMap {
    let data: BTreeMap<String, String> = [
        ("client-ca-file", pki.client_ca.pem()),
        (
            "requestheader-client-ca-file",
            front_proxy_ca_pem.to_string(),
        ),
        (
            "requestheader-allowed-names",
            r#"["front-proxy-client"]"#.into(),
        ),
        (
            "requestheader-username-headers",
            r#"["X-Remote-User"]"#.into(),
        ),
        (
            "requestheader-group-headers",
            r#"["X-Remote-Group"]"#.into(),
        ),
        (
            "requestheader-extra-headers-prefix",
            r#"["X-Remote-Extra-"]"#.into(),
        ),
        ("requestheader-uid-headers", r#"["X-Remote-Uid"]"#.into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    ConfigMap {
        metadata: ObjectMeta {
            name: Some("extension-apiserver-authentication".into()),
            namespace: Some("kube-system".into()),
            ..ObjectMeta::default()
        },
        data: Some(data),
        ..ConfigMap::default()
    }
}

/// The API server side: the ConfigMap, carol's token, and a policy allowing the HPA
/// controller, alice and carol, and nobody else.
fn configure_api(node: &KubeNode, pki: &Pki) {
    let api = node.api();
    api.apply_config_map(auth_config_map(pki, &pki.front_proxy_ca.pem()));
    api.set_token_user(
        GOOD_TOKEN,
        UserInfo {
            username: Some("carol".into()),
            uid: Some("uid-carol".into()),
            groups: Some(vec!["devs".into()]),
            extra: None,
        },
    );
    api.set_authorizer(|spec: &SubjectAccessReviewSpec| {
        matches!(spec.user.as_deref(), Some(HPA_USER | "alice" | "carol"))
    });
}

fn start(node: &KubeNode, exporter: &Exporter, pki: &Pki, extra: &[&str]) -> Adapter {
    let url = exporter.url("/metrics");
    let kubeconfig = node.kubeconfig().display().to_string();
    let mut args: Vec<String> = vec![
        format!("--exporter-url={url}"),
        "--scrape-interval=300ms".into(),
        format!("--kubeconfig={kubeconfig}"),
    ];
    args.extend(pki.serving_flags());
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Adapter::start_tls(&args)
}

/// The aggregator's headers for `user` in `groups`.
fn proxied<'a>(user: &'a str, groups: &[&'a str]) -> Vec<(&'a str, &'a str)> {
    let mut headers = vec![("X-Remote-User", user)];
    headers.extend(groups.iter().map(|g| ("X-Remote-Group", *g)));
    headers
}

fn status(client: &HttpsClient, url: &str, headers: &[(&str, &str)]) -> (u16, String) {
    client
        .get(url, headers)
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
}

/// Whether a metric list has items.
fn has_items(body: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["items"].as_array().map(|items| !items.is_empty()))
        .unwrap_or(false)
}

/// The `reason` of a `Status` body.
fn reason(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["reason"].as_str().map(str::to_string))
        .unwrap_or_else(|| format!("(not a Status: {body})"))
}

#[test]
fn the_auth_matrix_matches_a_delegated_kubernetes_api_server() {
    let node = KubeNode::start(SCENARIO, "node-a");
    let exporter = attributed_exporter(&node, SCENARIO);
    let pki = Pki::new("adapter-auth-matrix");
    configure_api(&node, &pki);
    let adapter = start(&node, &exporter, &pki, &[]);
    let url = |path: &str| format!("{}{path}", adapter.base);
    let api = node.api();

    let aggregator = pki.client(Some(&pki.front_proxy));
    let masters = proxied("system:kube-aggregator", &["system:masters"]);
    // The aggregator's availability probe: system:masters, so no review.
    let reviews_before = api.access_reviews().len();
    let mut last = (0, String::new());
    let ready = e2e_tests::try_wait_for(Duration::from_secs(30), || {
        last = status(&aggregator, &url(PODS_METRIC), &masters);
        (last.0 == 200 && has_items(&last.1)).then_some(())
    });
    assert!(
        ready.is_some(),
        "no pods metric with data; last answer {last:?}; log:\n{}",
        adapter.process.log()
    );
    assert_eq!(
        api.access_reviews().len(),
        reviews_before,
        "system:masters must bypass the SubjectAccessReview"
    );

    // Health is always allowed, even with no credentials.
    let anonymous = pki.client(None);
    for path in ["/healthz", "/livez", "/readyz"] {
        assert_eq!(status(&anonymous, &url(path), &[]).0, 200, "{path}");
    }

    // No credentials: anonymous, and the policy refuses anonymous → 403.
    let (code, body) = status(&anonymous, &url(PODS_METRIC), &[]);
    assert_eq!((code, reason(&body).as_str()), (403, "Forbidden"), "{body}");
    assert!(body.contains(r#"User \"system:anonymous\""#), "{body}");
    let last = api.access_reviews().pop().expect("a review for anonymous");
    assert_eq!(last.user.as_deref(), Some("system:anonymous"));
    assert_eq!(
        last.groups.as_deref(),
        Some(&["system:unauthenticated".to_string()][..])
    );

    // A spoofed X-Remote-User with no certificate is ignored: still anonymous → 403,
    // though the policy would allow the claimed user.
    let (code, body) = status(&anonymous, &url(PODS_METRIC), &proxied(HPA_USER, &[]));
    assert_eq!(code, 403, "{body}");
    assert_eq!(
        api.access_reviews().pop().and_then(|s| s.user).as_deref(),
        Some("system:anonymous")
    );

    // A front-proxy certificate from the wrong CA → 401 (it applies and fails).
    let rogue = pki.client(Some(&pki.front_proxy_wrong_ca));
    let (code, body) = status(&rogue, &url(PODS_METRIC), &masters);
    assert_eq!(
        (code, reason(&body).as_str()),
        (401, "Unauthorized"),
        "{body}"
    );

    // The right CA, but a CN that is not allowed → 401.
    let wrong_cn = pki.client(Some(&pki.front_proxy_wrong_cn));
    let (code, body) = status(&wrong_cn, &url(PODS_METRIC), &masters);
    assert_eq!(
        (code, reason(&body).as_str()),
        (401, "Unauthorized"),
        "{body}"
    );

    // The right CA and CN, but a certificate without the client-auth usage → 401.
    let server_only = pki.client(Some(&pki.front_proxy_server_only));
    let (code, body) = status(&server_only, &url(PODS_METRIC), &masters);
    assert_eq!(
        (code, reason(&body).as_str()),
        (401, "Unauthorized"),
        "{body}"
    );

    // A spoofed header next to a plain client certificate: the user is the
    // certificate's CN (mallory, refused), never the header's (the HPA, allowed).
    let mallory = pki.client(Some(&pki.mallory));
    let (code, body) = status(&mallory, &url(PODS_METRIC), &masters);
    assert_eq!((code, reason(&body).as_str()), (403, "Forbidden"), "{body}");
    let last = api.access_reviews().pop().expect("a review for mallory");
    assert_eq!(last.user.as_deref(), Some("mallory"));
    assert_eq!(
        last.groups.as_deref(),
        Some(&["system:authenticated".to_string()][..])
    );

    // A valid front-proxy request, as the HPA controller's arrives: 200, and the review
    // carries the proxied identity and the exact attributes.
    let hpa_headers = {
        let mut h = proxied(
            HPA_USER,
            &[
                "system:serviceaccounts",
                "system:serviceaccounts:kube-system",
            ],
        );
        h.push(("X-Remote-Uid", "uid-hpa"));
        h.push(("X-Remote-Extra-Example.com%2fteam", "platform"));
        h
    };
    let (code, body) = status(&aggregator, &url(PODS_METRIC), &hpa_headers);
    assert_eq!(code, 200, "{body}");
    let review = api.access_reviews().pop().expect("a review for the HPA");
    assert_eq!(review.user.as_deref(), Some(HPA_USER));
    assert_eq!(review.uid.as_deref(), Some("uid-hpa"));
    assert_eq!(
        review.groups,
        Some(vec![
            "system:serviceaccounts".to_string(),
            "system:serviceaccounts:kube-system".to_string(),
            "system:authenticated".to_string(),
        ])
    );
    assert_eq!(
        review.extra,
        Some(BTreeMap::from([(
            "example.com/team".to_string(),
            vec!["platform".to_string()]
        )]))
    );
    assert_eq!(
        review.resource_attributes,
        Some(ResourceAttributes {
            group: Some("custom.metrics.k8s.io".into()),
            version: Some("v1beta2".into()),
            resource: Some("pods".into()),
            subresource: Some("gpu_utilization".into()),
            name: Some("*".into()),
            namespace: Some("inference".into()),
            verb: Some("get".into()),
            ..ResourceAttributes::default()
        })
    );
    assert_eq!(review.non_resource_attributes, None);

    // The same request again within the TTL: answered from the cache, no new review.
    let before = api.access_reviews().len();
    assert_eq!(status(&aggregator, &url(PODS_METRIC), &hpa_headers).0, 200);
    assert_eq!(
        api.access_reviews().len(),
        before,
        "a cached decision must not cost a review"
    );

    // The external metric is authorized as `list` on the metric in the namespace.
    let (code, body) = status(&aggregator, &url(EXTERNAL_METRIC), &hpa_headers);
    assert_eq!(code, 200, "{body}");
    let external = api
        .access_reviews()
        .pop()
        .expect("a review for the external metric");
    assert_eq!(
        external.resource_attributes,
        Some(ResourceAttributes {
            group: Some("external.metrics.k8s.io".into()),
            version: Some("v1beta1".into()),
            resource: Some("gpu_utilization".into()),
            namespace: Some("inference".into()),
            verb: Some("list".into()),
            ..ResourceAttributes::default()
        })
    );

    // Discovery is a non-resource path; a denied one is 403 with the path named.
    let (code, body) = status(&mallory, &url("/apis/custom.metrics.k8s.io/v1beta2"), &[]);
    assert_eq!(code, 403, "{body}");
    assert!(
        body.contains(r#"cannot get path \"/apis/custom.metrics.k8s.io/v1beta2\""#),
        "{body}"
    );
    let discovery = api.access_reviews().pop().expect("a discovery review");
    assert_eq!(
        discovery
            .non_resource_attributes
            .and_then(|n| n.path.zip(n.verb)),
        Some(("/apis/custom.metrics.k8s.io/v1beta2".into(), "get".into()))
    );

    // Client-certificate authentication: user = CN, groups = O (+ authenticated).
    let alice = pki.client(Some(&pki.alice));
    let (code, body) = status(&alice, &url(PODS_METRIC), &[]);
    assert_eq!(code, 200, "{body}");
    let last = api.access_reviews().pop().expect("a review for alice");
    assert_eq!(last.user.as_deref(), Some("alice"));
    assert_eq!(
        last.groups,
        Some(vec![
            "team-a".to_string(),
            "system:authenticated".to_string()
        ])
    );

    // Bearer tokens through TokenReview: a valid one → 200 as carol, an invalid one → 401.
    let (code, body) = status(
        &anonymous,
        &url(PODS_METRIC),
        &[("Authorization", &format!("Bearer {GOOD_TOKEN}"))],
    );
    assert_eq!(code, 200, "{body}");
    let last = api.access_reviews().pop().expect("a review for carol");
    assert_eq!(last.user.as_deref(), Some("carol"));
    assert_eq!(last.uid.as_deref(), Some("uid-carol"));
    let (code, body) = status(
        &anonymous,
        &url(PODS_METRIC),
        &[("Authorization", "Bearer not-a-token")],
    );
    assert_eq!(
        (code, reason(&body).as_str()),
        (401, "Unauthorized"),
        "{body}"
    );
    let tokens: BTreeSet<Option<String>> =
        api.token_reviews().into_iter().map(|s| s.token).collect();
    assert!(tokens.contains(&Some(GOOD_TOKEN.to_string())));
    assert!(tokens.contains(&Some("not-a-token".to_string())));
    // Both TokenReview answers, the yes and the no, are cached.
    let token_reviews = api.token_reviews().len();
    for (token, want) in [(GOOD_TOKEN, 200), ("not-a-token", 401)] {
        let (code, _) = status(
            &anonymous,
            &url(PODS_METRIC),
            &[("Authorization", &format!("Bearer {token}"))],
        );
        assert_eq!(code, want, "{token} again");
    }
    assert_eq!(
        api.token_reviews().len(),
        token_reviews,
        "cached TokenReview answers must not cost a review"
    );
    // A bad token is refused even on a path anyone may read: authentication comes first.
    let (code, _) = status(
        &anonymous,
        &url("/healthz"),
        &[("Authorization", "Bearer not-a-token")],
    );
    assert_eq!(code, 401);

    // SAR deny for an authenticated user is 403 with the resource named.
    let (code, body) = status(&mallory, &url(EXTERNAL_METRIC), &[]);
    assert_eq!(code, 403, "{body}");
    assert!(
        body.contains(r#"cannot list resource \"gpu_utilization\" in API group \"external.metrics.k8s.io\" in the namespace \"inference\""#),
        "{body}"
    );
    // A denial is cached too: the same request again is refused without a review.
    let access_reviews = api.access_reviews().len();
    assert_eq!(status(&mallory, &url(EXTERNAL_METRIC), &[]).0, 403);
    assert_eq!(
        api.access_reviews().len(),
        access_reviews,
        "a cached denial must not cost a review"
    );

    // The adapter's own /metrics is guarded like any non-resource path: mallory is
    // refused after a review of `get /metrics`; carol reads it, and it counted the
    // refusals above by their final status.
    let (code, body) = status(&mallory, &url("/metrics"), &[]);
    assert_eq!(code, 403, "{body}");
    assert!(body.contains(r#"cannot get path \"/metrics\""#), "{body}");
    let metrics_review = api.access_reviews().pop().expect("a /metrics review");
    assert_eq!(
        metrics_review
            .non_resource_attributes
            .and_then(|n| n.path.zip(n.verb)),
        Some(("/metrics".into(), "get".into()))
    );
    let (code, text) = status(
        &anonymous,
        &url("/metrics"),
        &[("Authorization", &format!("Bearer {GOOD_TOKEN}"))],
    );
    assert_eq!(code, 200, "{text}");
    let counted = |api: &str, code: u16| {
        e2e_tests::sample_value(
            &text,
            &format!("gpu_metrics_adapter_http_requests_total{{api=\"{api}\",code=\"{code}\"}}"),
        )
        .unwrap_or(0.0)
    };
    assert!(counted("custom", 401) >= 2.0, "{text}");
    assert!(counted("external", 403) >= 2.0, "{text}");
    assert!(counted("external", 200) >= 1.0, "{text}");
    assert!(counted("metrics", 403) >= 1.0, "{text}");
    // How each request was authenticated, and every review by how it was answered: the
    // reviews the adapter says it asked are exactly those the API server received.
    let value = |sample: String| e2e_tests::sample_value(&text, &sample).unwrap_or(0.0);
    for outcome in [
        "front-proxy",
        "client-certificate",
        "token",
        "anonymous",
        "failure",
    ] {
        let sample = format!("gpu_metrics_adapter_authentications_total{{outcome=\"{outcome}\"}}");
        assert!(value(sample) >= 1.0, "{outcome}: {text}");
    }
    let reviews = |review: &str, result: &str| {
        value(format!(
            "gpu_metrics_adapter_delegated_reviews_total{{review=\"{review}\",result=\"{result}\"}}"
        ))
    };
    let asked = |review: &str| reviews(review, "allowed") + reviews(review, "denied");
    assert_eq!(
        asked("SubjectAccessReview"),
        api.access_reviews().len() as f64,
        "{text}"
    );
    assert_eq!(
        asked("TokenReview"),
        api.token_reviews().len() as f64,
        "{text}"
    );
    for review in ["SubjectAccessReview", "TokenReview"] {
        assert!(reviews(review, "denied") >= 1.0, "{review}: {text}");
        assert!(reviews(review, "cached") >= 2.0, "{review}: {text}");
        assert_eq!(reviews(review, "error"), 0.0, "{review}: {text}");
    }

    // The front-proxy CA rotates through the ConfigMap: the old proxy certificate stops
    // working and one from the new CA starts, without a restart.
    let new_front_proxy_ca = Ca::new("front-proxy-ca-2");
    let new_front_proxy = new_front_proxy_ca.client("front-proxy-client", &[]);
    api.apply_config_map(auth_config_map(&pki, &new_front_proxy_ca.pem()));
    let rotated = pki.client(Some(&new_front_proxy));
    wait_for(
        "the rotated front-proxy CA",
        Duration::from_secs(30),
        || (status(&rotated, &url(PODS_METRIC), &masters).0 == 200).then_some(()),
    );
    assert_eq!(status(&aggregator, &url(PODS_METRIC), &masters).0, 401);

    // The serving certificate rotates too: rewrite its files with one from a new CA;
    // new connections get it.
    let new_serving_ca = Ca::new("serving-ca-2");
    new_serving_ca
        .server(&["localhost", "127.0.0.1"])
        .write(&pki.dir, "serving");
    let trusting_new = HttpsClient::new(&new_serving_ca.pem(), None);
    wait_for(
        "the rotated serving certificate",
        Duration::from_secs(30),
        || {
            trusting_new
                .get(&url("/healthz"), &[])
                .ok()
                .filter(|(c, _)| *c == 200)
        },
    );
    let stale = anonymous.get(&url("/healthz"), &[]);
    assert!(
        stale.is_err(),
        "a client trusting only the old CA must fail: {stale:?}"
    );
}

#[test]
fn plain_http_to_the_tls_port_is_refused_cleanly() {
    let node = KubeNode::start(SCENARIO, "node-a");
    let exporter = attributed_exporter(&node, SCENARIO);
    let pki = Pki::new("adapter-auth-plain-http");
    configure_api(&node, &pki);
    let adapter = start(&node, &exporter, &pki, &[]);
    let plain = adapter.base.replacen("https://", "http://", 1);
    let (code, body) = e2e_tests::get(&format!("{plain}/healthz"));
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("HTTP request to an HTTPS server"), "{body}");
}

/// kubectl with a kubeconfig naming the adapter, the serving CA and a client
/// certificate; without the certificate, and with anonymous authentication off, 401.
#[test]
fn kubectl_get_raw_with_a_client_certificate() {
    let node = KubeNode::start(SCENARIO, "node-a");
    let exporter = attributed_exporter(&node, SCENARIO);
    let pki = Pki::new("adapter-auth-kubectl");
    configure_api(&node, &pki);
    let adapter = start(&node, &exporter, &pki, &["--anonymous-auth=false"]);
    let ca = pki.dir.join("serving-ca.crt");
    std::fs::write(&ca, pki.serving_ca.pem()).expect("write CA");
    let (alice_cert, alice_key) = pki.alice.write(&pki.dir, "alice");
    let kubeconfig = |with_cert: bool| {
        let user = if with_cert {
            format!(
                "    client-certificate: {}\n    client-key: {}\n",
                alice_cert.display(),
                alice_key.display()
            )
        } else {
            // Credentials the adapter does not accept (basic auth): with none at all,
            // kubectl stops to prompt for a user name on stdin.
            "    username: nobody\n    password: nothing\n".to_string()
        };
        let path = pki.dir.join(if with_cert {
            "with-cert.kubeconfig"
        } else {
            "no-cert.kubeconfig"
        });
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: adapter\n  cluster:\n    server: {}\n    certificate-authority: {}\nusers:\n- name: u\n  user:\n{user}contexts:\n- name: c\n  context:\n    cluster: adapter\n    user: u\ncurrent-context: c\n",
            adapter.base,
            ca.display()
        );
        std::fs::write(&path, text).expect("write kubeconfig");
        path
    };
    let kubectl = |config: &PathBuf| {
        let out = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(config)
            .args(["get", "--raw", PODS_METRIC])
            .output()
            .expect("run kubectl");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let with_cert = kubeconfig(true);
    let body = wait_for(
        "kubectl get --raw with data",
        Duration::from_secs(30),
        || {
            let (ok, stdout, _) = kubectl(&with_cert);
            (ok && has_items(&stdout)).then_some(stdout)
        },
    );
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON from kubectl");
    assert_eq!(v["kind"], "MetricValueList");

    let (ok, _, stderr) = kubectl(&kubeconfig(false));
    assert!(!ok, "kubectl without a certificate must fail");
    assert!(
        stderr.contains("Unauthorized") || stderr.contains("401"),
        "kubectl must report 401: {stderr}"
    );
}

/// KEDA's external scaler port: TLS with the serving certificate, and with
/// --grpc-client-ca-file mutual TLS: no client certificate, no call.
#[test]
fn the_keda_grpc_port_speaks_tls_and_mutual_tls() {
    use gpu_metrics_adapter::faces::keda::proto::ScaledObjectRef;
    use gpu_metrics_adapter::faces::keda::proto::external_scaler_client::ExternalScalerClient;

    let node = KubeNode::start(SCENARIO, "node-a");
    let exporter = attributed_exporter(&node, SCENARIO);
    let pki = Pki::new("adapter-auth-grpc");
    configure_api(&node, &pki);
    let keda_ca = Ca::new("keda-ca");
    let keda_ca_file = pki.dir.join("keda-ca.crt");
    std::fs::write(&keda_ca_file, keda_ca.pem()).expect("write KEDA CA");
    let adapter = start(
        &node,
        &exporter,
        &pki,
        &[&format!("--grpc-client-ca-file={}", keda_ca_file.display())],
    );
    let grpc = adapter.grpc_address();
    let keda = keda_ca.client("keda-operator", &[]);
    let stranger = Ca::new("other").client("keda-operator", &[]);

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let call = |identity: Option<&Leaf>| {
        let mut config = e2e_tests::https::client_config(&pki.serving_ca.pem(), identity);
        config.alpn_protocols = vec![b"h2".to_vec()];
        let config = std::sync::Arc::new(config);
        let grpc = grpc.clone();
        rt.block_on(async move {
            let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))
                .map_err(|e| e.to_string())?
                .connect_timeout(Duration::from_secs(5));
            let channel = endpoint
                .connect_with_connector(tower::service_fn(move |_uri| {
                    let config = config.clone();
                    let grpc = grpc.clone();
                    async move {
                        let tcp = tokio::net::TcpStream::connect(&grpc).await?;
                        let name = rustls_pki_types::ServerName::try_from("localhost")
                            .map_err(std::io::Error::other)?;
                        let tls = tokio_rustls::TlsConnector::from(config)
                            .connect(name, tcp)
                            .await?;
                        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
                    }
                }))
                .await
                .map_err(|e| format!("connect: {e:?}"))?;
            let mut client = ExternalScalerClient::new(channel);
            let reply = tokio::time::timeout(
                Duration::from_secs(10),
                client.is_active(ScaledObjectRef {
                    name: "resnet".into(),
                    namespace: "inference".into(),
                    scaler_metadata: [
                        ("metric", "gpu_utilization"),
                        ("targetValue", "30"),
                        ("podSelector", "app=resnet-inference"),
                    ]
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                }),
            )
            .await
            .map_err(|_| "timed out".to_string())?
            .map_err(|e| format!("rpc: {e:?}"))?;
            Ok::<bool, String>(reply.into_inner().result)
        })
    };
    // Active once the adapter has scraped: the resnet pods use their GPUs.
    let mut last = Err(String::new());
    let active = e2e_tests::try_wait_for(Duration::from_secs(30), || {
        last = call(Some(&keda));
        (last == Ok(true)).then_some(())
    });
    assert!(active.is_some(), "IsActive over mutual TLS: {last:?}");
    let anonymous = call(None);
    assert!(
        anonymous.is_err(),
        "no client certificate must be refused: {anonymous:?}; log:\n{}",
        adapter.process.log()
    );
    let strange = call(Some(&stranger));
    assert!(
        strange.is_err(),
        "a certificate from another CA must be refused: {strange:?}"
    );
}

/// When the API server cannot answer a review, nothing is allowed: a SubjectAccessReview
/// that fails is a 500 (never an allow), a TokenReview that fails a 401; both work
/// again once the API server is back, and failures are not cached.
#[test]
fn reviews_that_cannot_be_made_refuse_the_request() {
    let node = KubeNode::start(SCENARIO, "node-a");
    let exporter = attributed_exporter(&node, SCENARIO);
    let pki = Pki::new("adapter-auth-outage");
    configure_api(&node, &pki);
    let adapter = start(&node, &exporter, &pki, &[]);
    let url = format!("{}{PODS_METRIC}", adapter.base);
    let alice = pki.client(Some(&pki.alice));
    let token = format!("Bearer {GOOD_TOKEN}");
    let bearer = [("Authorization", token.as_str())];
    let anonymous = pki.client(None);

    node.api().set_available(false);
    let (code, body) = status(&alice, &url, &[]);
    assert_eq!(
        (code, reason(&body).as_str()),
        (500, "InternalError"),
        "{body}"
    );
    let (code, body) = status(&anonymous, &url, &bearer);
    assert_eq!(
        (code, reason(&body).as_str()),
        (401, "Unauthorized"),
        "{body}"
    );
    // Health stays answerable: it needs no review.
    assert_eq!(
        status(&anonymous, &format!("{}/livez", adapter.base), &[]).0,
        200
    );

    node.api().set_available(true);
    wait_for("reviews after the outage", Duration::from_secs(30), || {
        let alice_ok = status(&alice, &url, &[]).0 == 200;
        let carol_ok = status(&anonymous, &url, &bearer).0 == 200;
        (alice_ok && carol_ok).then_some(())
    });
    // The failed reviews were counted as errors (the outage answered at least one of
    // each), and were not cached: the same requests were allowed right after.
    let (code, text) = status(&alice, &format!("{}/metrics", adapter.base), &[]);
    assert_eq!(code, 200, "{text}");
    for review in ["SubjectAccessReview", "TokenReview"] {
        let sample = format!(
            "gpu_metrics_adapter_delegated_reviews_total{{review=\"{review}\",result=\"error\"}}"
        );
        let errors = e2e_tests::sample_value(&text, &sample).unwrap_or(0.0);
        assert!(errors >= 1.0, "{review}: {text}");
    }
}
