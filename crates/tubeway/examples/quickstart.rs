//! An embedded broker and a client in one program: a function call, a queue
//! round trip and a publish/subscribe, over TCP on a free port.
//!
//!     cargo run -p tubeway --example quickstart

use std::time::Duration;

use tubeway::ops::QueueKind;
use tubeway::{AsyncClient, Broker, BrokerConfig, Message};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let broker = Broker::new(BrokerConfig::default());
    broker.create_function("greet", |m: Message| {
        let name = m.text_payload()?.into_owned();
        Ok(Message::plain_text(format!("hello, {name}")))
    })?;
    let url = broker.listen(&"tcp://127.0.0.1:0".parse()?).await?;
    println!("broker listening on {url}");

    let client = AsyncClient::connect(&url.to_string()).await?;

    // Request/reply.
    let reply = client.send("greet", Message::plain_text("tubeway")).await?;
    println!("call    -> {}", reply.text_payload()?);

    // A bounded queue: offer, then poll.
    client.create_queue("jobs", 100, QueueKind::Bounded).await?;
    let job = Message::data(&serde_json::json!({"job": 1, "args": [2, 3]}));
    client.offer("jobs", job, Duration::from_secs(1)).await?;
    if let Some(m) = client.poll("jobs", Duration::from_secs(1)).await? {
        println!("poll    -> {}", m.data_payload()?);
    }

    // Publish/subscribe.
    client.create_topic("news").await?;
    let mut sub = client.subscribe("news").await?;
    client
        .publish("news", Message::plain_text("extra!"))
        .await?;
    if let Some(m) = sub.recv().await {
        println!("deliver -> {}", m.text_payload()?);
    }

    let stats = client.stats().await?;
    println!(
        "stats   -> {} connection(s), {} frames in, {} out",
        stats.connections, stats.messages_in, stats.messages_out
    );
    client.close().await;
    broker.shutdown().await;
    Ok(())
}
