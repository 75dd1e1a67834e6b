//! Arbitrary bytes, cut into arbitrary chunks, through the frame decoder and every message
//! decoder (the JSON ones and the coordinators' binary one): nothing may panic, and whatever
//! decodes must encode and decode back to itself.

#![no_main]

use herder_core::protocol::codec::{
    decode_binary_message, decode_message, encode_binary_frame, encode_frame, FrameDecoder,
    WireMessage,
};
use herder_core::protocol::{
    ClientReply, ClientRequest, CoordinatorToWorker, PeerMessage, WorkerToCoordinator,
};
use libfuzzer_sys::fuzz_target;

const FRAME_MAX: usize = 64 * 1024;

fn round_trip<M: WireMessage + PartialEq + std::fmt::Debug>(payload: &[u8]) {
    let Ok(message) = decode_message::<M>(payload) else {
        return;
    };
    let mut frame = Vec::new();
    encode_frame(&message, 16 * 1024 * 1024, &mut frame).expect("a decoded message encodes");
    let mut decoder = FrameDecoder::new(16 * 1024 * 1024);
    decoder.extend(&frame);
    let again = decoder
        .next_message::<M>()
        .expect("an encoded message decodes")
        .expect("a whole frame");
    assert_eq!(again, message, "the message changed on the way round");
}

/// The binary form of the coordinators' link, round the same way.
fn binary_round_trip(payload: &[u8]) {
    let Ok(message) = decode_binary_message::<PeerMessage>(payload) else {
        return;
    };
    let mut frame = Vec::new();
    encode_binary_frame(&message, 16 * 1024 * 1024, &mut frame)
        .expect("a decoded message encodes");
    let mut decoder = FrameDecoder::new(16 * 1024 * 1024);
    decoder.extend(&frame);
    let again = decoder
        .next_binary_message::<PeerMessage>()
        .expect("an encoded message decodes")
        .expect("a whole frame");
    assert_eq!(again, message, "the message changed on the way round");
}

fuzz_target!(|data: &[u8]| {
    let Some((&chunk, rest)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(chunk).max(1);
    let mut decoder = FrameDecoder::new(FRAME_MAX);
    for piece in rest.chunks(chunk) {
        decoder.extend(piece);
        while let Ok(Some(payload)) = decoder.next_frame() {
            assert!(payload.len() <= FRAME_MAX);
            round_trip::<ClientRequest>(&payload);
            round_trip::<ClientReply>(&payload);
            round_trip::<WorkerToCoordinator>(&payload);
            round_trip::<CoordinatorToWorker>(&payload);
            round_trip::<PeerMessage>(&payload);
            binary_round_trip(&payload);
        }
    }
});
