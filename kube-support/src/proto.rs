//! The wire types, generated once by `build.rs` from `proto/` (prost names a module per
//! protobuf package; the nesting below mirrors the package paths the generated code
//! refers to).

/// The kubelet's PodResources v1 API (`k8s.io/kubelet/pkg/apis/podresources/v1`),
/// client and server.
#[allow(clippy::all, missing_docs)] // generated code
pub mod podresources {
    tonic::include_proto!("v1");

    pub use pod_resources_lister_client::PodResourcesListerClient;
    pub use pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer};
}

/// KEDA's external scaler service (`externalscaler.ExternalScaler`), server and client.
#[allow(clippy::all, missing_docs)] // generated code
pub mod keda {
    tonic::include_proto!("externalscaler");
}

#[allow(clippy::all, missing_docs)] // generated code
mod generated {
    pub mod io {
        pub mod prometheus {
            pub mod client {
                include!(concat!(env!("OUT_DIR"), "/io.prometheus.client.rs"));
            }
        }
    }
    pub mod google {
        pub mod protobuf {
            include!(concat!(env!("OUT_DIR"), "/google.protobuf.rs"));
        }
    }
}

/// `google.protobuf.Timestamp`, as the exposition's exemplars and created timestamps
/// use it.
pub use generated::google::protobuf::Timestamp;
/// The Prometheus client data model (`io.prometheus.client`): the messages of the
/// protobuf exposition format.
pub use generated::io::prometheus::client as prometheus;
