//! Each face is served only where `ServerConfig::faces` names it: a face left out
//! answers as a route that does not exist, and the others work as they do alone.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use sandcell::testing::MockBackend;
use sandcell_server::{Face, ServerConfig};

/// The statuses of a Fly list, a wire-face capabilities read and an E2B list, with
/// `faces` served.
async fn statuses(faces: &[Face]) -> [u16; 3] {
    let mut config = ServerConfig::new(common::TOKEN);
    config.faces = faces.iter().copied().collect();
    let served = common::serve_backend(Arc::new(MockBackend::new()), config).await;
    let http = reqwest::Client::new();
    let get = |path: &str| {
        http.get(format!("{}{path}", served.url))
            .bearer_auth(common::TOKEN)
            .header("X-API-Key", common::TOKEN)
            .send()
    };
    [
        get("/v1/apps/sandcell/machines")
            .await
            .unwrap()
            .status()
            .as_u16(),
        get("/v1/sandcell/capabilities")
            .await
            .unwrap()
            .status()
            .as_u16(),
        get("/sandboxes").await.unwrap().status().as_u16(),
    ]
}

#[tokio::test]
async fn only_the_faces_asked_for_are_served() {
    assert_eq!(statuses(&Face::ALL).await, [200, 200, 200]);
    assert_eq!(statuses(&[Face::Fly]).await, [200, 404, 404]);
    assert_eq!(statuses(&[Face::E2b]).await, [404, 404, 200]);
    assert_eq!(statuses(&[Face::Fly, Face::Wire]).await, [200, 200, 404]);
}

#[test]
fn faces_parse_by_name_and_refuse_others() {
    for face in Face::ALL {
        assert_eq!(face.name().parse::<Face>().unwrap(), face);
    }
    let refused = "ssh".parse::<Face>().unwrap_err();
    assert_eq!(refused.kind(), sandcell::ErrorKind::InvalidInput);
}
