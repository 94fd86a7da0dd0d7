//! How other threads hand work to a priority thread: a channel plus a mio
//! waker, so the event loop sleeps in one `epoll_wait` for both sockets and
//! posted work.

use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};
use duplex_proto::osd::OpReply;
use duplex_proto::Frame;

/// Work posted to a priority thread.
pub enum Completion {
    /// A client request's reply is ready (reads, sync writes; pool mode: anything).
    Reply { token: usize, slot: u64, reply: OpReply },
    /// The sync write path applied a write locally (primary), or failed to.
    LocalApplied { txid: u64, ok: bool },
    /// Send this frame on connection `token` (replica acks).
    Send { token: usize, frame: Frame },
    /// Logs were trimmed: writes waiting for room may go on.
    Flushed,
    /// A new connection for this thread to own.
    Accepted(mio::net::TcpStream),
    /// Pool mode: a worker ran a request; the thread does the I/O it asks for.
    Worked(Box<crate::ops::Outcome>),
}

#[derive(Clone)]
pub struct Mailbox {
    pub sender: Sender<Completion>,
    pub waker: Arc<mio::Waker>,
}

impl Mailbox {
    pub fn new(waker: mio::Waker) -> (Mailbox, Receiver<Completion>) {
        let (sender, receiver) = crossbeam_channel::unbounded();
        (Mailbox { sender, waker: Arc::new(waker) }, receiver)
    }

    /// Posts without waking (call [`Mailbox::wake`] once after a burst).
    pub fn post(&self, completion: Completion) {
        // The receiver lives as long as the thread; a send after it ended has no one to tell.
        let _ = self.sender.send(completion);
    }

    pub fn wake(&self) {
        let _ = self.waker.wake();
    }

    pub fn post_and_wake(&self, completion: Completion) {
        self.post(completion);
        self.wake();
    }
}
