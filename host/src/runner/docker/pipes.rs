//! Blocking `Read`/`Write` ends over an attached `docker exec`, so the coordinator's channel
//! code stays synchronous. Buffers are bounded: a worker that floods its output waits for the
//! reader instead of filling the host's memory.

use bytes::Bytes;
use futures_util::StreamExt;
use std::io::{Read, Write};
use std::pin::Pin;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

/// Chunks in flight per stream.
const DEPTH: usize = 16;

/// The reading end of a container's stdout or stderr.
pub struct PipeReader {
    rx: mpsc::Receiver<Bytes>,
    pending: Bytes,
}

impl Read for PipeReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.pending.is_empty() {
            match self.rx.blocking_recv() {
                Some(chunk) => self.pending = chunk,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.pending.len());
        buf[..n].copy_from_slice(&self.pending[..n]);
        self.pending = self.pending.slice(n..);
        Ok(n)
    }
}

/// The writing end of a container's stdin; dropping it closes the stream.
pub struct PipeWriter {
    tx: mpsc::Sender<Vec<u8>>,
}

impl Write for PipeWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.tx
            .blocking_send(buf.to_vec())
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the exec ended"))?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The output stream of an attached exec.
pub type ExecOutput = Pin<
    Box<
        dyn futures_util::Stream<
                Item = Result<bollard::container::LogOutput, bollard::errors::Error>,
            > + Send,
    >,
>;

/// Spawns the tasks that move bytes between an attached exec and blocking pipe ends.
pub fn attach(
    runtime: &tokio::runtime::Handle,
    mut output: ExecOutput,
    mut input: Pin<Box<dyn AsyncWrite + Send>>,
) -> (PipeWriter, PipeReader, PipeReader) {
    let (in_tx, mut in_rx) = mpsc::channel::<Vec<u8>>(DEPTH);
    let (out_tx, out_rx) = mpsc::channel(DEPTH);
    let (err_tx, err_rx) = mpsc::channel(DEPTH);
    runtime.spawn(async move {
        while let Some(chunk) = in_rx.recv().await {
            if input.write_all(&chunk).await.is_err() || input.flush().await.is_err() {
                return;
            }
        }
        let _ = input.shutdown().await;
    });
    runtime.spawn(async move {
        // A reader that went away only means its bytes are no longer wanted: keep draining so
        // the other stream still flows until the exec ends or its container is killed.
        let (mut out_open, mut err_open) = (true, true);
        while let Some(Ok(item)) = output.next().await {
            match item {
                bollard::container::LogOutput::StdOut { message } if out_open => {
                    out_open = out_tx.send(message).await.is_ok();
                }
                bollard::container::LogOutput::StdErr { message } if err_open => {
                    err_open = err_tx.send(message).await.is_ok();
                }
                _ => {}
            }
        }
    });
    (
        PipeWriter { tx: in_tx },
        PipeReader {
            rx: out_rx,
            pending: Bytes::new(),
        },
        PipeReader {
            rx: err_rx,
            pending: Bytes::new(),
        },
    )
}
