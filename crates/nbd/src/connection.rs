//! One client connection from accept to close.
//!
//! The connection thread runs the handshake (under one deadline), starts the
//! writer thread, and then becomes the request reader. A clean end (DISC or
//! end of stream) waits for in-flight commands to be answered before
//! closing; anything else closes at once. [`ConnectionControl`] lets the
//! server end a connection from outside: gently (stop reading, so in-flight
//! commands are still answered) or at once.

use std::io::BufReader;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::Instant;

use tracing::{debug, warn};

use crate::config::ServerConfig;
use crate::gate::InFlightGate;
use crate::handshake::{self, HandshakeError, Outcome};
use crate::stream::{DeadlineStream, Stream};
use crate::transmission::{self, TransmissionError};
use crate::writer::{self, Outgoing};
use crate::Exports;

/// Large enough to take several pipelined request headers per read.
const READ_BUFFER_BYTES: usize = 64 * 1024;

/// What the server keeps to close a connection from another thread.
pub(crate) struct ConnectionControl {
    pub(crate) stream: Arc<Stream>,
    pub(crate) gate: InFlightGate,
}

impl ConnectionControl {
    pub(crate) fn new(stream: Stream, config: &ServerConfig) -> Self {
        let gate = InFlightGate::new(config.max_in_flight_per_connection, config.max_in_flight_bytes_per_connection);
        ConnectionControl { stream: Arc::new(stream), gate }
    }

    /// Stops reading requests: the reader sees end of stream, so commands in
    /// flight are still answered before the connection closes.
    pub(crate) fn stop_reading(&self) {
        self.stream.shutdown_read();
    }

    /// Unblocks the reader, the writer and any wait on the gate.
    pub(crate) fn close(&self) {
        self.gate.close();
        self.stream.shutdown();
    }
}

pub(crate) fn serve(id: u64, control: Arc<ConnectionControl>, exports: &dyn Exports, config: &ServerConfig) {
    let peer = control.stream.peer();
    debug!(id, %peer, "nbd connection accepted");
    let deadline = Instant::now() + config.handshake_timeout;
    let mut reader =
        BufReader::with_capacity(READ_BUFFER_BYTES, DeadlineStream::new(Arc::clone(&control.stream), Some(deadline)));
    let mut handshake_writer = DeadlineStream::new(Arc::clone(&control.stream), Some(deadline));
    let negotiated = match handshake::negotiate(&mut reader, &mut handshake_writer, exports) {
        Ok(Outcome::Transmission(negotiated)) => negotiated,
        Ok(Outcome::Aborted) => {
            debug!(id, %peer, "client aborted the handshake");
            control.close();
            return;
        }
        Err(HandshakeError::Protocol(reason)) => {
            warn!(id, %peer, %reason, "nbd handshake violation; disconnecting");
            control.close();
            return;
        }
        Err(HandshakeError::Io(error)) => {
            debug!(id, %peer, %error, "nbd handshake ended");
            control.close();
            return;
        }
    };
    if let Err(error) = reader.get_mut().clear_deadline() {
        debug!(id, %error, "could not clear the handshake timeouts");
        control.close();
        return;
    }
    debug!(id, %peer, export = %negotiated.name, read_only = negotiated.read_only, "nbd transmission started");

    let (replies, outgoing) = mpsc::channel();
    let writer_control = Arc::clone(&control);
    let writer_thread = thread::Builder::new().name(format!("nbd-writer-{id}")).spawn(move || {
        if let Err(error) = writer::write_replies(&*writer_control.stream, &outgoing, &writer_control.gate) {
            debug!(id, %error, "nbd reply write failed");
            writer_control.close();
        }
    });
    let writer_thread = match writer_thread {
        Ok(handle) => handle,
        Err(error) => {
            warn!(id, %error, "could not start the nbd writer thread");
            control.close();
            return;
        }
    };
    // Should the Export panic on this thread, the writer must still stop and the socket close.
    let _stop_on_unwind = StopOnDrop { replies: replies.clone(), control: Arc::clone(&control) };

    let result =
        transmission::serve_requests(&mut reader, &negotiated.export, negotiated.read_only, &control.gate, &replies);
    match result {
        Ok(ending) => {
            debug!(id, ?ending, "nbd client finished; draining in-flight commands");
            control.gate.wait_idle();
        }
        Err(TransmissionError::Protocol(reason)) => {
            warn!(id, %peer, %reason, "nbd protocol violation; disconnecting");
            control.close();
        }
        Err(error) => {
            debug!(id, %error, "nbd connection ended");
            control.close();
        }
    }
    let _ = replies.send(Outgoing::Stop);
    drop(replies);
    if writer_thread.join().is_err() {
        warn!(id, "nbd writer thread panicked");
    }
    control.close();
    debug!(id, %peer, "nbd connection closed");
}

/// Sends the writer `Stop` and closes the connection when dropped.
struct StopOnDrop {
    replies: mpsc::Sender<Outgoing>,
    control: Arc<ConnectionControl>,
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        let _ = self.replies.send(Outgoing::Stop);
        self.control.close();
    }
}
