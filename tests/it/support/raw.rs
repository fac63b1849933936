//! Raw gRPC calls: message bodies sent as given (mutated or undecodable bytes) through the real gRPC
//! framing, responses decoded as protobuf.
use tonic::transport::Channel;

/// A gRPC codec that sends raw bytes as the message body (to send mutated or undecodable messages
/// through the real gRPC framing) and decodes responses as `R`.
pub struct RawCodec<R>(std::marker::PhantomData<R>);

impl<R> Default for RawCodec<R> {
    fn default() -> Self {
        RawCodec(std::marker::PhantomData)
    }
}

pub struct RawEncoder;
pub struct ProstDecoder<R>(std::marker::PhantomData<R>);

impl tonic::codec::Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        bytes::BufMut::put_slice(dst, &item);
        Ok(())
    }
}

impl<R: prost::Message + Default> tonic::codec::Decoder for ProstDecoder<R> {
    type Item = R;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<R>, tonic::Status> {
        R::decode(src)
            .map(Some)
            .map_err(|e| tonic::Status::internal(e.to_string()))
    }
}

impl<R: prost::Message + Default + Send + 'static> tonic::codec::Codec for RawCodec<R> {
    type Encode = Vec<u8>;
    type Decode = R;
    type Encoder = RawEncoder;
    type Decoder = ProstDecoder<R>;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> ProstDecoder<R> {
        ProstDecoder(std::marker::PhantomData)
    }
}

/// Opens a bidirectional or client-streaming call on `path` (like "/cloakd.v1.LocationBroker/Submit")
/// sending raw message bodies, and returns the response stream.
pub async fn raw_streaming_call<R: prost::Message + Default + Send + 'static>(
    channel: Channel,
    path: &'static str,
    bodies: impl futures::Stream<Item = Vec<u8>> + Send + 'static,
) -> Result<tonic::Streaming<R>, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel).max_encoding_message_size(usize::MAX);
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let path = http::uri::PathAndQuery::from_static(path);
    grpc.streaming(tonic::Request::new(bodies), path, RawCodec::<R>::default())
        .await
        .map(tonic::Response::into_inner)
}
