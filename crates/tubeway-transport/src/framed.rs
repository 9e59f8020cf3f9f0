use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tubeway_proto::{DecodeError, Decoded, Decoder, EncodedFrame};

use crate::{BoxRead, BoxWrite};

/// Smallest read buffer; also the chunk size used while skipping an oversized frame.
const READ_CHUNK: usize = 64 * 1024;
/// A write batch stops growing past this many bytes...
const BATCH_BYTES: usize = 1 << 20;
/// ...or this many frames.
const BATCH_FRAMES: usize = 256;
/// Slices passed to one `writev` (Linux's IOV_MAX is 1024).
const MAX_IOV: usize = 512;

/// Why reading frames stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// The socket failed.
    #[error("read failed: {0}")]
    Io(#[from] io::Error),
    /// The stream's framing is lost.
    #[error("protocol error: {0}")]
    Decode(#[from] DecodeError),
    /// The peer closed the stream in the middle of a frame.
    #[error("peer closed the connection mid-frame ({0} bytes of a partial frame)")]
    UnexpectedEof(usize),
}

/// Reads frames from a byte stream, checking every length before allocating.
pub struct FrameReader {
    reader: BoxRead,
    buf: BytesMut,
    decoder: Decoder,
}

impl std::fmt::Debug for FrameReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameReader")
            .field("buffered", &self.buf.len())
            .field("decoder", &self.decoder)
            .finish()
    }
}

impl FrameReader {
    /// Reads frames of at most `max_frame` bytes from `reader`.
    pub fn new(reader: BoxRead, max_frame: usize) -> Self {
        FrameReader {
            reader,
            buf: BytesMut::with_capacity(READ_CHUNK),
            decoder: Decoder::new(max_frame),
        }
    }

    /// Changes the maximum for frames not yet started.
    pub fn set_max_frame(&mut self, max_frame: usize) {
        self.decoder.set_max_frame(max_frame);
    }

    /// The next decoded item; `Ok(None)` on a clean end of stream between frames.
    pub async fn next(&mut self) -> Result<Option<Decoded>, ReadError> {
        loop {
            if let Some(d) = self.decoder.decode(&mut self.buf)? {
                return Ok(Some(d));
            }
            // `wanted` is bounded by the maximum frame size, so a hostile length
            // never makes us reserve more than that.
            let want = self.decoder.wanted(&self.buf).max(READ_CHUNK);
            self.buf.reserve(want);
            let n = self.reader.read_buf(&mut self.buf).await?;
            if n == 0 {
                if self.decoder.is_idle(&self.buf) {
                    return Ok(None);
                }
                return Err(ReadError::UnexpectedEof(self.buf.len()));
            }
        }
    }
}

/// Counters a writer keeps.
#[derive(Debug, Default)]
pub struct WriteBatch {
    /// Frames written.
    pub frames: AtomicU64,
    /// `writev` calls made.
    pub syscalls: AtomicU64,
}

/// Writes every frame queued on `rx` to `w` until all senders are gone.
///
/// Frames queued together go out in one vectored write: the writer takes one
/// frame, then everything else already queued (up to a bound), and hands the
/// kernel the heads and the payloads as separate slices, so payloads are
/// never copied.
pub async fn write_frames(
    mut w: BoxWrite,
    mut rx: mpsc::Receiver<EncodedFrame>,
    stats: &WriteBatch,
) -> io::Result<()> {
    let mut chunks: VecDeque<Bytes> = VecDeque::new();
    while let Some(first) = rx.recv().await {
        let mut frames = 1u64;
        let mut bytes = first.len();
        push(&mut chunks, first);
        while bytes < BATCH_BYTES && frames < BATCH_FRAMES as u64 {
            match rx.try_recv() {
                Ok(f) => {
                    bytes += f.len();
                    frames += 1;
                    push(&mut chunks, f);
                }
                Err(_) => break,
            }
        }
        write_all_vectored(&mut w, &mut chunks, stats).await?;
        stats.frames.fetch_add(frames, Ordering::Relaxed);
    }
    w.shutdown().await
}

fn push(chunks: &mut VecDeque<Bytes>, f: EncodedFrame) {
    chunks.push_back(f.head);
    if !f.payload.is_empty() {
        chunks.push_back(f.payload);
    }
}

async fn write_all_vectored(
    w: &mut BoxWrite,
    chunks: &mut VecDeque<Bytes>,
    stats: &WriteBatch,
) -> io::Result<()> {
    while !chunks.is_empty() {
        let n = {
            let slices: Vec<IoSlice<'_>> = chunks
                .iter()
                .take(MAX_IOV)
                .map(|b| IoSlice::new(b))
                .collect();
            w.write_vectored(&slices).await?
        };
        stats.syscalls.fetch_add(1, Ordering::Relaxed);
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        consume(chunks, n);
    }
    Ok(())
}

/// Drops the first `written` bytes of `chunks`, as a vectored write of them
/// took them: whole chunks are removed, a partly written one is advanced.
/// For writers that keep their own queue of chunks (as [`write_frames`] does).
pub fn consume(chunks: &mut VecDeque<Bytes>, written: usize) {
    let mut left = written;
    while left > 0 {
        let Some(front) = chunks.front_mut() else {
            break;
        };
        if front.len() <= left {
            left -= front.len();
            chunks.pop_front();
        } else {
            front.advance(left);
            left = 0;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::{connect, Listener, Url};
    use tubeway_proto::{codec, Message};

    async fn pair(url: &str) -> (crate::Connection, crate::Connection) {
        let url: Url = url.parse().unwrap();
        let mut l = Listener::bind(&url).await.unwrap();
        let bound = l.local_url().clone();
        let (a, b) = tokio::join!(l.accept(), connect(&bound));
        (a.unwrap(), b.unwrap())
    }

    async fn exchange(url: &str) {
        let (server, client) = pair(url).await;
        let (tx, rx) = mpsc::channel(16);
        let stats = std::sync::Arc::new(WriteBatch::default());
        let s2 = stats.clone();
        let writer = tokio::spawn(async move { write_frames(client.writer, rx, &s2).await });
        let msgs: Vec<Message> = (0..100)
            .map(|i| Message::binary(vec![i as u8; i * 1000], None))
            .collect();
        let to_send = msgs.clone();
        tokio::spawn(async move {
            for m in &to_send {
                tx.send(codec::encode(m, 1 << 24).unwrap()).await.unwrap();
            }
        });
        let mut r = FrameReader::new(server.reader, 1 << 24);
        for m in &msgs {
            match r.next().await.unwrap() {
                Some(Decoded::Message(got)) => assert_eq!(&got, m),
                other => panic!("{other:?}"),
            }
        }
        assert!(r.next().await.unwrap().is_none());
        writer.await.unwrap().unwrap();
        assert_eq!(stats.frames.load(Ordering::Relaxed), 100);
    }

    #[test]
    fn consume_removes_written_bytes() {
        let mut chunks: VecDeque<Bytes> = [&b"abc"[..], b"de", b"fgh"]
            .into_iter()
            .map(Bytes::from_static)
            .collect();
        consume(&mut chunks, 0);
        assert_eq!(chunks.len(), 3);
        consume(&mut chunks, 4);
        assert_eq!(
            chunks,
            [Bytes::from_static(b"e"), Bytes::from_static(b"fgh")]
        );
        consume(&mut chunks, 2);
        assert_eq!(chunks, [Bytes::from_static(b"gh")]);
        consume(&mut chunks, 10);
        assert!(chunks.is_empty());
    }

    #[tokio::test]
    async fn frames_over_tcp() {
        exchange("tcp://127.0.0.1:0").await;
    }

    #[tokio::test]
    async fn frames_over_unix() {
        let p = std::env::temp_dir().join(format!("tw-t-{}.sock", std::process::id()));
        exchange(&format!("unix://{}", p.display())).await;
    }

    #[tokio::test]
    async fn frames_over_mem() {
        exchange("mem://framed-test").await;
    }

    #[tokio::test]
    async fn eof_mid_frame_is_an_error() {
        let (server, mut client) = pair("mem://eof-test").await;
        let bytes = codec::encode(&Message::plain_text("abc"), 1024)
            .unwrap()
            .to_vec();
        client
            .writer
            .write_all(&bytes[..bytes.len() - 1])
            .await
            .unwrap();
        client.writer.shutdown().await.unwrap();
        let mut r = FrameReader::new(server.reader, 1024);
        assert!(matches!(r.next().await, Err(ReadError::UnexpectedEof(_))));
    }

    #[tokio::test]
    async fn stale_unix_socket_is_replaced_live_one_is_not() {
        let p = std::env::temp_dir().join(format!("tw-stale-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&p);
        drop(std::os::unix::net::UnixListener::bind(&p).unwrap()); // leaves the file behind
        let url = Url::Unix(p.clone());
        let l = Listener::bind(&url).await.unwrap();
        assert!(Listener::bind(&url).await.is_err());
        drop(l);
        assert!(!p.exists());
    }
}
