//! Graceful shutdown: the real server on a socket finishes the requests in flight, then stops.

use std::time::Duration;

use envlens::config::Limits;
use envlens::state::AppState;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::*;

fn hook_request(body: &str) -> String {
    format!(
        "POST /webhooks/gitlab HTTP/1.1\r\nHost: x\r\nX-Gitlab-Token: {WEBHOOK_TOKEN}\r\nX-Gitlab-Event: System Hook\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[tokio::test]
async fn shutdown_lets_the_request_in_flight_finish() {
    let app = TestApp::new().await;
    app.system_hook(
        &serde_json::json!({"event_name": "user_create", "user_id": 1, "username": "alice"}),
    )
    .await;
    let state = AppState::new(app.db.clone(), keys(), Limits::default());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(envlens::run(
        state,
        listener,
        async { stop_rx.await.unwrap_or(()) },
        Duration::from_secs(10),
    ));

    // Hold the user's row so that the rename below stays in flight.
    let mut blocker = app.db.begin().await.unwrap();
    sqlx::query("SELECT * FROM users WHERE id = 1 FOR UPDATE")
        .execute(&mut *blocker)
        .await
        .unwrap();
    let mut client = TcpStream::connect(addr).await.unwrap();
    let rename = r#"{"event_name": "user_rename", "user_id": 1, "username": "bob", "old_username": "alice"}"#;
    client
        .write_all(hook_request(rename).as_bytes())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;

    stop_tx.send(()).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !server.is_finished(),
        "the server waits for the request in flight"
    );
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "no new connections once shutting down"
    );

    blocker.rollback().await.unwrap();
    let mut answer = String::new();
    client.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("server stops")
        .unwrap()
        .unwrap();
    assert_eq!(
        app.rows("SELECT username FROM users").await,
        vec![serde_json::json!({"username": "bob"})]
    );
}
