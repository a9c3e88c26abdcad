//! Headless Chromium driven over the DevTools protocol: a few commands over one WebSocket
//! (`tokio-tungstenite`), enough to open pages, read the DOM, emulate a screen, take
//! screenshots and record every request and WebSocket frame a page sends or receives. The
//! browser tests and the dashboard benchmark (`benches/dashboard.rs --screen`) share it.
//!
//! Chromium is Debian's `chromium` package (`.ci/run` installs it); without it the browser
//! tests skip with a message ([`Browser::launch`] returns `None`).

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::Message;

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Value>>>>;

pub struct Browser {
    child: tokio::process::Child,
    _profile: tempfile::TempDir,
    out: mpsc::UnboundedSender<String>,
    pending: Pending,
    next: AtomicU64,
    /// Every event the browser sent, in order.
    events: Arc<Mutex<Vec<Value>>>,
}

/// One tab, attached with its own session.
pub struct Page<'a> {
    browser: &'a Browser,
    session: String,
}

fn chromium() -> Option<PathBuf> {
    if let Ok(path) = std::env::var("CHROMIUM") {
        return Some(PathBuf::from(path));
    }
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find_map(|name| {
            std::env::var_os("PATH").and_then(|paths| {
                std::env::split_paths(&paths)
                    .map(|dir| dir.join(name))
                    .find(|p| p.is_file())
            })
        })
}

impl Browser {
    /// Starts headless Chromium with a fresh profile; `None` (after saying why) when it is
    /// not installed.
    pub async fn launch() -> Option<Browser> {
        let Some(binary) = chromium() else {
            eprintln!("skipped: no chromium on the PATH (Debian: apt-get install chromium)");
            return None;
        };
        // On a loaded machine (the suite starts several browsers at once beside its servers)
        // a start can be slow, or end before it listens: one more try, saying why.
        let mut said = Vec::new();
        for _ in 0..2 {
            match Self::start(&binary).await {
                Ok(browser) => return Some(browser),
                Err(lines) => said = lines,
            }
        }
        panic!("chromium did not print its DevTools address twice; it said: {said:#?}");
    }

    /// One start: the browser, or what Chromium printed before it stopped or 90 s passed.
    async fn start(binary: &Path) -> Result<Browser, Vec<String>> {
        let profile = tempfile::tempdir().expect("a profile folder");
        let mut child = tokio::process::Command::new(binary)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-dev-shm-usage",
                "--remote-debugging-port=0",
                "--window-size=1440,900",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("chromium starts");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let mut said = Vec::new();
        let url = tokio::time::timeout(Duration::from_secs(90), async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(url) = line.strip_prefix("DevTools listening on ") {
                    return Some(url.trim().to_owned());
                }
                said.push(line);
            }
            None
        })
        .await
        .ok()
        .flatten();
        let Some(url) = url else {
            let _ = child.kill().await;
            return Err(said);
        };
        // Keep reading stderr so that Chromium never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });

        let (socket, _) = tokio_tungstenite::connect_async(url.as_str())
            .await
            .expect("the DevTools WebSocket");
        let (mut sink, mut stream) = socket.split();
        let (out, mut outgoing) = mpsc::unbounded_channel::<String>();
        tokio::spawn(async move {
            while let Some(text) = outgoing.recv().await {
                if sink.send(Message::text(text)).await.is_err() {
                    break;
                }
            }
        });
        let pending: Pending = Arc::default();
        let events: Arc<Mutex<Vec<Value>>> = Arc::default();
        let (p, e) = (pending.clone(), events.clone());
        tokio::spawn(async move {
            while let Some(Ok(message)) = stream.next().await {
                let Message::Text(text) = message else {
                    continue;
                };
                let Ok(value) = serde_json::from_str::<Value>(&text) else {
                    continue;
                };
                match value["id"].as_u64() {
                    Some(id) => {
                        if let Some(tx) = p.lock().unwrap().remove(&id) {
                            let _ = tx.send(value);
                        }
                    }
                    None => e.lock().unwrap().push(value),
                }
            }
        });
        Ok(Browser {
            child,
            _profile: profile,
            out,
            pending,
            next: AtomicU64::new(1),
            events,
        })
    }

    async fn call(&self, session: Option<&str>, method: &str, params: Value) -> Value {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let mut message = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            message["sessionId"] = json!(s);
        }
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap().insert(id, tx);
        self.out
            .send(message.to_string())
            .expect("the DevTools socket");
        let answer = tokio::time::timeout(Duration::from_secs(30), rx)
            .await
            .unwrap_or_else(|_| panic!("{method}: no answer"))
            .expect("an answer");
        if let Some(error) = answer.get("error") {
            panic!("{method}: {error}");
        }
        answer["result"].clone()
    }

    /// A new tab, its network recorded.
    pub async fn page(&self) -> Page<'_> {
        let target = self
            .call(None, "Target.createTarget", json!({"url": "about:blank"}))
            .await;
        let attached = self
            .call(
                None,
                "Target.attachToTarget",
                json!({"targetId": target["targetId"], "flatten": true}),
            )
            .await;
        let page = Page {
            browser: self,
            session: attached["sessionId"].as_str().unwrap().to_owned(),
        };
        page.call("Page.enable", json!({})).await;
        page.call("Network.enable", json!({})).await;
        page.call("Runtime.enable", json!({})).await;
        page
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

impl Page<'_> {
    pub async fn call(&self, method: &str, params: Value) -> Value {
        self.browser.call(Some(&self.session), method, params).await
    }

    /// Opens `url` and waits for the page to be loaded.
    pub async fn goto(&self, url: &str) {
        self.call("Page.navigate", json!({"url": url})).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        self.wait_for(
            "document.readyState === 'complete'",
            Duration::from_secs(30),
        )
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    }

    /// The value of a JavaScript expression (promises awaited).
    pub async fn eval(&self, expression: &str) -> Value {
        let result = self
            .call(
                "Runtime.evaluate",
                json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
            )
            .await;
        if let Some(e) = result.get("exceptionDetails") {
            panic!("{expression}: {e}");
        }
        result["result"]["value"].clone()
    }

    /// Waits until `expression` is true.
    pub async fn wait_for(&self, expression: &str, timeout: Duration) -> Result<(), String> {
        let start = Instant::now();
        loop {
            let result = self
                .call(
                    "Runtime.evaluate",
                    json!({"expression": format!("!!({expression})"), "returnByValue": true}),
                )
                .await;
            if result["result"]["value"] == json!(true) {
                return Ok(());
            }
            if start.elapsed() > timeout {
                return Err(format!("not true after {timeout:?}: {expression}"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn text(&self) -> String {
        self.eval("document.body.innerText")
            .await
            .as_str()
            .unwrap_or("")
            .to_owned()
    }

    pub async fn url(&self) -> String {
        self.eval("location.href")
            .await
            .as_str()
            .unwrap_or("")
            .to_owned()
    }

    /// A screen `width` wide, light or dark.
    pub async fn screen(&self, width: u32, dark: bool) {
        self.call(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": width < 600}),
        )
        .await;
        self.call(
            "Emulation.setEmulatedMedia",
            json!({"features": [{"name": "prefers-color-scheme", "value": if dark { "dark" } else { "light" }}]}),
        )
        .await;
    }

    /// A PNG of the whole page at `path`.
    pub async fn screenshot(&self, path: &Path) {
        self.capture(path, true).await;
    }

    /// A PNG of what the screen shows (the first 900 px of a long page), at `path`.
    pub async fn screenshot_screen(&self, path: &Path) {
        self.capture(path, false).await;
    }

    async fn capture(&self, path: &Path, whole: bool) {
        let shot = self
            .call(
                "Page.captureScreenshot",
                json!({"format": "png", "captureBeyondViewport": whole}),
            )
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().unwrap())
            .unwrap();
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(path, png).unwrap();
    }

    /// How many DevTools events the browser has sent so far: a mark for [`Page::events_since`].
    pub fn mark(&self) -> usize {
        self.browser.events.lock().unwrap().len()
    }

    /// This tab's DevTools events since `mark`, in order (`Network.webSocketFrameReceived`,
    /// `Network.requestWillBeSent`, ...).
    pub fn events_since(&self, mark: usize) -> Vec<Value> {
        self.browser.events.lock().unwrap()[mark..]
            .iter()
            .filter(|e| e["sessionId"].as_str() == Some(self.session.as_str()))
            .cloned()
            .collect()
    }

    /// Runs `source` in every document this tab opens from now on, before the page's own
    /// scripts.
    pub async fn on_new_document(&self, source: &str) {
        self.call(
            "Page.addScriptToEvaluateOnNewDocument",
            json!({"source": source}),
        )
        .await;
    }

    /// Every URL this browser requested so far.
    pub fn requests(&self) -> Vec<String> {
        self.browser
            .events
            .lock()
            .unwrap()
            .iter()
            .filter(|e| {
                e["method"] == "Network.requestWillBeSent"
                    || e["method"] == "Network.webSocketCreated"
            })
            .filter_map(|e| {
                e["params"]["request"]["url"]
                    .as_str()
                    .or(e["params"]["url"].as_str())
                    .map(str::to_owned)
            })
            .collect()
    }
}
