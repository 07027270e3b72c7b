//! The broker's client port: SendMessage answered through a batch queue, every other call proxied.
//!
//! Python's gRPC server spends about 300 µs of CPU on each unary call, more than the broker's
//! whole durable publish, so the publish rate was bound by the server rather than the WAL. This
//! front serves the client port with hyper: a `danube.ProducerService/SendMessage` request is
//! put on a queue, Python takes the queued requests in batches (`next_batch`), stores them and
//! answers each with `reply` or `fail`. Every other call, streaming or not, is forwarded as it
//! is to the broker's Python gRPC server on a loopback port, so the services keep one
//! implementation.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::net::TcpListener as StdListener;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderValue, CONTENT_TYPE};
use hyper::service::service_fn;
use hyper::{Method, Request, Response};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tokio::sync::{oneshot, watch};
use tokio::task::{JoinHandle, JoinSet};

const SEND_PATH: &str = "/danube.ProducerService/SendMessage";
const GRPC_OK: u16 = 0;
const GRPC_INTERNAL: u16 = 13;
const GRPC_UNAVAILABLE: u16 = 14;
const GRPC_RESOURCE_EXHAUSTED: u16 = 8;
/// Flow-control windows of the loopback connection to the Python server (see `GrpcFront::new`):
/// 8 MiB per call keeps large messages moving at loopback speed; the connection's 1 GiB sets
/// h2's small-DATA-frame budget to 512 MiB of framing overhead.
const UPSTREAM_STREAM_WINDOW: u32 = 8 << 20;
const UPSTREAM_CONNECTION_WINDOW: u32 = 1 << 30;

type Body = BoxBody<Bytes, hyper::Error>;
/// What `next_batch` hands Python: (ticket, serialized StreamMessage) pairs.
type Batch<'py> = Vec<(u64, Bound<'py, PyBytes>)>;

/// What Python answered for one queued request.
enum Reply {
    Message(Bytes),
    Status(u16, String),
}

struct InboxState {
    queued: VecDeque<(u64, Bytes)>,
    waiting: HashMap<u64, oneshot::Sender<Reply>>,
    next_ticket: u64,
    closed: bool,
}

/// Requests waiting for Python, and the reply channel of each one Python has taken.
struct Inbox {
    state: Mutex<InboxState>,
    ready: Condvar,
}

impl Inbox {
    fn new() -> Self {
        Inbox {
            state: Mutex::new(InboxState {
                queued: VecDeque::new(),
                waiting: HashMap::new(),
                next_ticket: 1,
                closed: false,
            }),
            ready: Condvar::new(),
        }
    }

    /// Queue a request; None once the front is closed.
    fn push(&self, request: Bytes) -> Option<oneshot::Receiver<Reply>> {
        let (sender, receiver) = oneshot::channel();
        let mut state = self.state.lock().unwrap();
        if state.closed {
            return None;
        }
        let ticket = state.next_ticket;
        state.next_ticket += 1;
        state.waiting.insert(ticket, sender);
        state.queued.push_back((ticket, request));
        if state.queued.len() == 1 {
            self.ready.notify_one();
        }
        Some(receiver)
    }

    /// Up to `max` queued requests, waiting up to `timeout` for the first; None once closed.
    fn take(&self, max: usize, timeout: Duration) -> Option<Vec<(u64, Bytes)>> {
        let deadline = Instant::now() + timeout;
        let mut state = self.state.lock().unwrap();
        while state.queued.is_empty() && !state.closed {
            let now = Instant::now();
            if now >= deadline {
                return Some(Vec::new());
            }
            state = self.ready.wait_timeout(state, deadline - now).unwrap().0;
        }
        if state.queued.is_empty() {
            return None;
        }
        let count = max.min(state.queued.len());
        Some(state.queued.drain(..count).collect())
    }

    fn answer(&self, ticket: u64, reply: Reply) -> bool {
        let sender = self.state.lock().unwrap().waiting.remove(&ticket);
        match sender {
            Some(sender) => {
                let _ = sender.send(reply); // the caller may have gone: nothing to tell it
                true
            }
            None => false,
        }
    }

    /// Refuse new requests and answer the queued ones, which Python has not seen, with
    /// UNAVAILABLE: nothing of them is stored, so the client may send them again. Requests
    /// Python has taken keep their reply channel: it may have stored them, and its answer
    /// still reaches the client while the connections drain.
    fn close(&self, reason: &str) {
        let mut state = self.state.lock().unwrap();
        state.closed = true;
        let queued: Vec<(u64, Bytes)> = state.queued.drain(..).collect();
        for (ticket, _) in queued {
            if let Some(sender) = state.waiting.remove(&ticket) {
                let _ = sender.send(Reply::Status(GRPC_UNAVAILABLE, reason.to_string()));
            }
        }
        self.ready.notify_all();
    }
}

struct Shared {
    inbox: Inbox,
    upstream: String,
    client: Client<HttpConnector, Incoming>,
    max_message_bytes: usize,
}

/// `grpc-message` is percent-encoded (gRPC over HTTP/2: bytes outside 0x20..0x7E, and '%').
fn percent_encode(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for byte in message.bytes() {
        if (0x20..=0x7e).contains(&byte) && byte != b'%' {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn grpc_headers(headers: &mut HeaderMap) {
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
}

/// A trailers-only response: the status in the headers, no body.
fn status_response(code: u16, message: &str) -> Response<Body> {
    let mut response = Response::new(Empty::<Bytes>::new().map_err(|never| match never {}).boxed());
    let headers = response.headers_mut();
    grpc_headers(headers);
    headers.insert("grpc-status", HeaderValue::from(code));
    if let Ok(value) = HeaderValue::from_str(&percent_encode(message)) {
        headers.insert("grpc-message", value);
    }
    response
}

fn message_response(message: Bytes) -> Response<Body> {
    let mut framed = BytesMut::with_capacity(5 + message.len());
    framed.put_u8(0);
    framed.put_u32(message.len() as u32);
    framed.put_slice(&message);
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from(GRPC_OK));
    let body = Full::new(framed.freeze())
        .with_trailers(async move { Some(Ok(trailers)) })
        .map_err(|never| match never {})
        .boxed();
    let mut response = Response::new(body);
    grpc_headers(response.headers_mut());
    response
}

/// The one message of a unary gRPC request body, or the status to answer instead.
fn unary_message(mut body: Bytes) -> Result<Bytes, (u16, String)> {
    if body.len() < 5 {
        return Err((GRPC_INTERNAL, format!("SendMessage body of {} bytes has no gRPC message frame", body.len())));
    }
    let compressed = body.get_u8();
    let length = body.get_u32() as usize;
    if compressed != 0 {
        return Err((GRPC_INTERNAL, "SendMessage frame is flagged compressed without a grpc-encoding".into()));
    }
    if body.len() != length {
        return Err((GRPC_INTERNAL, format!(
            "SendMessage frame announces {length} bytes but the request holds {} after it (one message expected)",
            body.len())));
    }
    Ok(body)
}

async fn send_message(shared: Arc<Shared>, request: Request<Incoming>) -> Response<Body> {
    let limit = shared.max_message_bytes + 5;
    let body = match Limited::new(request.into_body(), limit).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(error) => {
            if error.downcast_ref::<http_body_util::LengthLimitError>().is_some() {
                return status_response(GRPC_RESOURCE_EXHAUSTED, &format!(
                    "SendMessage larger than the broker's limit of {} bytes", shared.max_message_bytes));
            }
            return status_response(GRPC_INTERNAL, &format!("reading SendMessage failed: {error}"));
        }
    };
    let message = match unary_message(body) {
        Ok(message) => message,
        Err((code, text)) => return status_response(code, &text),
    };
    let Some(receiver) = shared.inbox.push(message) else {
        return status_response(GRPC_UNAVAILABLE, "broker is stopping");
    };
    match receiver.await {
        Ok(Reply::Message(message)) => message_response(message),
        Ok(Reply::Status(code, text)) => status_response(code, &text),
        Err(_) => status_response(GRPC_UNAVAILABLE, "broker is stopping"),
    }
}

/// Forward a call to the Python gRPC server unchanged; its response streams back as it comes.
async fn forward(shared: Arc<Shared>, request: Request<Incoming>) -> Response<Body> {
    let (mut parts, body) = request.into_parts();
    let path = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    parts.uri = match format!("http://{}{}", shared.upstream, path).parse() {
        Ok(uri) => uri,
        Err(error) => return status_response(GRPC_INTERNAL, &format!("bad request path {path}: {error}")),
    };
    match shared.client.request(Request::from_parts(parts, body)).await {
        Ok(response) => response.map(|body| body.boxed()),
        Err(error) => status_response(GRPC_UNAVAILABLE, &format!("broker services unreachable: {error}")),
    }
}

fn is_plain_send(request: &Request<Incoming>) -> bool {
    let identity = match request.headers().get("grpc-encoding") {
        None => true,
        Some(value) => value.as_bytes() == b"identity",
    };
    request.method() == Method::POST && request.uri().path() == SEND_PATH && identity
}

async fn route(shared: Arc<Shared>, request: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    if is_plain_send(&request) {
        Ok(send_message(shared, request).await)
    } else {
        Ok(forward(shared, request).await)
    }
}

/// Accept connections until `stop`; then let every connection finish its calls in progress
/// within `grace` (HTTP/2 GOAWAY), and return.
async fn serve(listener: tokio::net::TcpListener, shared: Arc<Shared>, mut stop: watch::Receiver<bool>, grace: Duration) {
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            _ = stop.changed() => break,
        };
        let Ok((stream, _)) = accepted else { continue };
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        let mut stop = stop.clone();
        connections.spawn(async move {
            let service = service_fn(move |request| route(shared.clone(), request));
            // As Python's gRPC server: no limit on a connection's concurrent calls (a client's
            // long ReceiveMessages streams must not hold back its sends), and flow-control
            // windows that grow with the traffic, for large messages.
            // Fixed windows, not adaptive ones: h2 closes a connection whose small unread DATA
            // frames pass half its connection window (GOAWAY ENHANCE_YOUR_CALM), and a client's
            // many small acks wait unread while the machine is busy; the stream window bounds
            // what one call buffers.
            let connection = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .max_concurrent_streams(None)
                .initial_stream_window_size(UPSTREAM_STREAM_WINDOW)
                .initial_connection_window_size(UPSTREAM_CONNECTION_WINDOW)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                _ = stop.changed() => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
        });
    }
    drop(listener);
    let _ = tokio::time::timeout(grace, async { while connections.join_next().await.is_some() {} }).await;
}

/// The client port of one broker (see the module's doc).
#[pyclass(module = "broker._grpc_front")]
struct GrpcFront {
    shared: Arc<Shared>,
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
    server: Mutex<Option<JoinHandle<()>>>,
    stop: watch::Sender<bool>,
    grace: Duration,
    port: u16,
}

#[pymethods]
impl GrpcFront {
    /// Listen on `bind` ("host:port"), forwarding all but SendMessage to `upstream` ("host:port").
    /// `grace`: seconds calls in progress get to finish when the front closes.
    #[new]
    #[pyo3(signature = (bind, upstream, max_message_bytes, threads=1, grace=1.0))]
    fn new(bind: &str, upstream: &str, max_message_bytes: usize, threads: usize, grace: f64) -> PyResult<Self> {
        if threads == 0 {
            return Err(PyValueError::new_err("threads must be at least 1"));
        }
        if !(grace.is_finite() && grace >= 0.0) {
            return Err(PyValueError::new_err(format!("grace {grace}: expected seconds >= 0")));
        }
        let grace = Duration::from_secs_f64(grace);
        let listener = StdListener::bind(bind)
            .map_err(|error| PyOSError::new_err(format!("cannot listen on {bind}: {error}")))?;
        listener.set_nonblocking(true).map_err(|error| PyOSError::new_err(error.to_string()))?;
        let port = listener.local_addr().map_err(|error| PyOSError::new_err(error.to_string()))?.port();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("grpc-front")
            .enable_all()
            .build()
            .map_err(|error| PyOSError::new_err(format!("cannot start the gRPC front's runtime: {error}")))?;
        // The upstream is this broker's own Python server on loopback. Its responses are often
        // many small DATA frames (one gRPC message each) that wait in this client until the
        // downstream client takes them; h2 counts small unread frames against a budget of half
        // the connection window and closes the connection (GOAWAY ENHANCE_YOUR_CALM
        // "too_many_data_frames") when a slow reader lets them pile up, failing every call on it.
        // A large connection window makes that budget larger than the frames any stream window
        // can hold; the stream window bounds what one call buffers.
        let client = Client::builder(TokioExecutor::new())
            .http2_only(true)
            .http2_initial_stream_window_size(UPSTREAM_STREAM_WINDOW)
            .http2_initial_connection_window_size(UPSTREAM_CONNECTION_WINDOW)
            .build_http();
        let shared = Arc::new(Shared {
            inbox: Inbox::new(),
            upstream: upstream.to_string(),
            client,
            max_message_bytes,
        });
        let (stop, stopped) = watch::channel(false);
        let listener = {
            let _entered = runtime.enter();
            tokio::net::TcpListener::from_std(listener).map_err(|error| PyOSError::new_err(error.to_string()))?
        };
        let server = runtime.spawn(serve(listener, shared.clone(), stopped, grace));
        Ok(GrpcFront { shared, runtime: Mutex::new(Some(runtime)), server: Mutex::new(Some(server)), stop, grace, port })
    }

    /// The port it listens on (useful when bound to port 0).
    #[getter]
    fn port(&self) -> u16 {
        self.port
    }

    /// Up to `max` SendMessage requests as (ticket, serialized StreamMessage), waiting up to
    /// `timeout` seconds for the first (an empty list if none came); None once closed.
    fn next_batch<'py>(&self, py: Python<'py>, max: usize, timeout: f64) -> PyResult<Option<Batch<'py>>> {
        if !(timeout.is_finite() && timeout >= 0.0) {
            return Err(PyValueError::new_err(format!("timeout {timeout}: expected seconds >= 0")));
        }
        let wait = Duration::from_secs_f64(timeout);
        let taken = py.allow_threads(|| self.shared.inbox.take(max.max(1), wait));
        Ok(taken.map(|batch| batch.into_iter().map(|(ticket, body)| (ticket, PyBytes::new(py, &body))).collect()))
    }

    /// SendMessage requests waiting for `next_batch`.
    fn queued(&self) -> usize {
        self.shared.inbox.state.lock().unwrap().queued.len()
    }

    /// Answer request `ticket` with a serialized MessageResponse; False if it is no longer waited for.
    fn reply(&self, ticket: u64, message: &[u8]) -> bool {
        self.shared.inbox.answer(ticket, Reply::Message(Bytes::copy_from_slice(message)))
    }

    /// Answer request `ticket` with gRPC status `code` and `message`.
    fn fail(&self, ticket: u64, code: u16, message: String) -> PyResult<bool> {
        if code == GRPC_OK || code > 16 {
            return Err(PyValueError::new_err(format!("gRPC status {code}: expected an error code 1..16")));
        }
        Ok(self.shared.inbox.answer(ticket, Reply::Status(code, message)))
    }

    /// Stop listening and close the connections, letting calls in progress finish within the
    /// grace; queued SendMessages get UNAVAILABLE. Idempotent. Python must keep answering the
    /// batches it has taken meanwhile, so call it off the thread that answers them.
    fn close(&self, py: Python<'_>) {
        self.shared.inbox.close("broker is stopping");
        let _ = self.stop.send(true);
        let runtime = self.runtime.lock().unwrap().take();
        let server = self.server.lock().unwrap().take();
        if let (Some(runtime), Some(server)) = (runtime, server) {
            let grace = self.grace;
            py.allow_threads(|| {
                let _ = runtime.block_on(async move { tokio::time::timeout(grace + Duration::from_secs(1), server).await });
                runtime.shutdown_timeout(Duration::from_secs(1))
            });
        }
    }
}

#[pymodule]
fn _grpc_front(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<GrpcFront>()?;
    Ok(())
}
