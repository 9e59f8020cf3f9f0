//! Passing a descriptor to the peer process over a Unix socket
//! (SCM_RIGHTS), as the shm transport passes its memory: a memfd handed
//! over this way leaves nothing behind in the file system.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

/// Writes all of `bytes`, with `fd` riding on the first of them.
pub fn send_with_fd(sock: &UnixStream, bytes: &[u8], fd: BorrowedFd<'_>) -> io::Result<()> {
    let fds = [fd];
    let mut sent = 0;
    while sent < bytes.len() {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if sent == 0 && !control.push(SendAncillaryMessage::ScmRights(&fds)) {
            return Err(io::Error::other("cannot attach the descriptor"));
        }
        let iov = [IoSlice::new(bytes.get(sent..).unwrap_or_default())];
        sent += rustix::net::sendmsg(sock, &iov, &mut control, SendFlags::NOSIGNAL)?;
    }
    Ok(())
}

/// Fills `buf` from `sock`, and returns the first descriptor that came
/// with the bytes (any other is closed).
pub fn recv_with_fd(sock: &UnixStream, buf: &mut [u8]) -> io::Result<Option<OwnedFd>> {
    let mut fd = None;
    let mut got = 0;
    while got < buf.len() {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let mut iov = [IoSliceMut::new(buf.get_mut(got..).unwrap_or_default())];
        let msg = rustix::net::recvmsg(sock, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC)?;
        if msg.bytes == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        for m in control.drain() {
            if let RecvAncillaryMessage::ScmRights(received) = m {
                for f in received {
                    fd.get_or_insert(f);
                }
            }
        }
        got += msg.bytes;
    }
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsFd;

    #[test]
    fn a_descriptor_travels_with_the_bytes() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut file = tempfile_in_memory();
        file.write_all(b"shared").unwrap();
        send_with_fd(&a, b"hello", file.as_fd()).unwrap();
        let mut buf = [0u8; 5];
        let fd = recv_with_fd(&b, &mut buf).unwrap().expect("a descriptor");
        assert_eq!(&buf, b"hello");
        let mut got = std::fs::File::from(fd);
        got.rewind().unwrap();
        let mut text = String::new();
        got.read_to_string(&mut text).unwrap();
        assert_eq!(text, "shared");
        // No descriptor, and a closed socket.
        (&a).write_all(b"x").unwrap();
        drop(a);
        let mut one = [0u8; 1];
        assert!(recv_with_fd(&b, &mut one).unwrap().is_none());
        assert!(recv_with_fd(&b, &mut one).is_err());
    }

    fn tempfile_in_memory() -> std::fs::File {
        let fd = rustix::fs::memfd_create("fdpass-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        std::fs::File::from(fd)
    }
}
