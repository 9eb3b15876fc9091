use std::sync::Mutex;

use rustls::server::ProducesTickets as _;

use super::*;

fn random() -> &'static dyn SecureRandom {
    crate::testing::provider().secure_random
}

/// A clock the test sets.
#[derive(Debug)]
struct At(Mutex<SystemTime>);

impl At {
    fn new(secs: u64) -> Arc<Self> {
        Arc::new(Self(Mutex::new(at(secs))))
    }

    fn set(&self, secs: u64) {
        *self.0.lock().unwrap() = at(secs);
    }
}

impl Clock for At {
    fn now(&self) -> SystemTime {
        *self.0.lock().unwrap()
    }
}

const HOUR: u64 = 3600;

/// A TLS 1.3 session as rustls writes it (no server name; then the version), and one with a
/// server name.
const TLS13: &[u8] = &[0, 0x03, 0x04, 0x13, 0x01, 1, 2, 3];
const TLS13_SNI: &[u8] = &[1, 3, b'a', b'.', b'b', 0x03, 0x04, 0x13, 0x01];
const TLS12: &[u8] = &[0, 0x03, 0x03, 0xc0, 0x2f, 1, 2, 3];

fn secret(byte: u8) -> Ticketer {
    ticketer(
        SessionTickets::from_secret(&[byte; 32]).unwrap(),
        &At::new(100 * HOUR),
    )
}

fn ticketer(tickets: SessionTickets, clock: &Arc<At>) -> Ticketer {
    Ticketer::new(
        tickets
            .rotation(Duration::from_secs(HOUR))
            .clock(Arc::clone(clock) as Arc<dyn Clock>),
    )
}

#[test]
fn processes_with_the_same_secret_open_each_others_tickets_and_nothing_else_opens() {
    let (one, two, other) = (secret(1), secret(1), secret(2));
    for plain in [TLS13, TLS13_SNI] {
        let ticket = one.encrypt(plain).expect("sealed");
        assert_eq!(two.decrypt(&ticket).as_deref(), Some(plain));
        assert_eq!(other.decrypt(&ticket), None, "another fleet's");
        let mut altered = ticket.clone();
        let last = altered.len() - 1;
        altered[last] ^= 1;
        assert_eq!(two.decrypt(&altered), None, "altered");
        assert_eq!(two.decrypt(&ticket[..ticket.len() - 1]), None, "cut");
    }
    for garbage in [&b""[..], b"x", &[0u8; 8], &[0u8; 64]] {
        assert_eq!(one.decrypt(garbage), None);
    }
    assert_eq!(one.status().key_id, two.status().key_id);
    assert_ne!(one.status().key_id, other.status().key_id);
    assert_eq!(one.status().source, "secret");
    assert!(
        SessionTickets::from_secret(&[1; 31]).is_err(),
        "a secret under 32 bytes"
    );
}

#[test]
fn tls_1_2_sessions_are_never_sealed_or_opened() {
    let one = secret(1);
    assert_eq!(one.encrypt(TLS12), None);
    assert_eq!(one.encrypt(&[]), None);
    assert_eq!(
        one.encrypt(&[1, 200, 0x03, 0x04]),
        None,
        "a name longer than the rest"
    );
}

#[test]
fn a_ticket_opens_until_two_periods_after_its_key_became_current() {
    let clock = At::new(100 * HOUR + 10);
    let issuer = ticketer(SessionTickets::from_secret(&[1; 32]).unwrap(), &clock);
    assert_eq!(issuer.lifetime(), 2 * 3600);
    let ticket = issuer.encrypt(TLS13).unwrap();
    let status = issuer.status();
    assert_eq!(status.since, at(100 * HOUR), "the period's start");
    assert_eq!(
        status.age,
        Duration::from_secs(10),
        "on the ticketer's clock"
    );
    for (now, opens) in [
        (100 * HOUR + 10, true),
        (101 * HOUR, true),
        (102 * HOUR - 1, true),
        (102 * HOUR, false),
        (200 * HOUR, false),
    ] {
        clock.set(now);
        assert_eq!(issuer.decrypt(&ticket).is_some(), opens, "at {now}");
    }
    // Keys rotate: the next period seals with another key.
    clock.set(101 * HOUR);
    assert_ne!(issuer.status().key_id, {
        clock.set(100 * HOUR);
        issuer.status().key_id
    });
}

#[test]
fn the_next_key_opens_a_period_ahead_so_a_replica_whose_clock_is_ahead_is_understood() {
    let (behind, ahead) = (At::new(100 * HOUR + 3590), At::new(101 * HOUR + 5));
    let late = ticketer(SessionTickets::from_secret(&[1; 32]).unwrap(), &behind);
    let early = ticketer(SessionTickets::from_secret(&[1; 32]).unwrap(), &ahead);
    let ticket = early.encrypt(TLS13).unwrap();
    assert_eq!(late.decrypt(&ticket).as_deref(), Some(TLS13));
}

#[test]
fn a_fleets_schedule_is_published_a_period_ahead_and_pruned_after_two() {
    let period = Duration::from_secs(HOUR);
    let first = next_schedule(&[], at(10 * HOUR), period, random())
        .unwrap()
        .unwrap();
    assert_eq!(
        first.iter().map(TicketKey::from).collect::<Vec<_>>(),
        [at(10 * HOUR), at(11 * HOUR)],
        "a current key and the next"
    );
    assert_eq!(
        next_schedule(&first, at(10 * HOUR + 5), period, random()).unwrap(),
        None
    );
    assert_eq!(next_due(&first, period), Some(at(11 * HOUR)));
    let second = next_schedule(&first, at(11 * HOUR), period, random())
        .unwrap()
        .unwrap();
    assert_eq!(
        second.iter().map(TicketKey::from).collect::<Vec<_>>(),
        [at(10 * HOUR), at(11 * HOUR), at(12 * HOUR)]
    );
    let third = next_schedule(&second, at(12 * HOUR), period, random())
        .unwrap()
        .unwrap();
    assert_eq!(
        third.iter().map(TicketKey::from).collect::<Vec<_>>(),
        [at(11 * HOUR), at(12 * HOUR), at(13 * HOUR)],
        "the first opens nothing any more"
    );
    // A writer away for a day: a current key now, and the next a period on.
    let late = next_schedule(&third, at(40 * HOUR), period, random())
        .unwrap()
        .unwrap();
    assert_eq!(
        late.iter().map(TicketKey::from).collect::<Vec<_>>(),
        [at(40 * HOUR), at(41 * HOUR)]
    );
    assert!(
        !format!("{late:?}").contains(&format!("{:?}", late[0].secret())),
        "no secret in Debug"
    );
}

#[test]
fn replicas_on_a_fleets_keys_share_tickets_and_use_their_own_until_the_keys_are_readable() {
    let clock = At::new(10 * HOUR);
    let keys = SharedTicketKeys::new();
    let one = ticketer(SessionTickets::shared(keys.clone()).unwrap(), &clock);
    let two = ticketer(SessionTickets::shared(keys.clone()).unwrap(), &clock);
    let before = one.status();
    assert_eq!(before.source, "local");
    assert!(before.note.is_some(), "{before:?}");
    let own = one.encrypt(TLS13).unwrap();
    assert_eq!(two.decrypt(&own), None, "each its own keys");
    assert_eq!(one.decrypt(&own).as_deref(), Some(TLS13));

    let schedule = next_schedule(&[], at(10 * HOUR), Duration::from_secs(HOUR), random())
        .unwrap()
        .unwrap();
    keys.publish(schedule.clone());
    let status = one.status();
    assert_eq!(
        (status.source, status.note, status.key_id.as_str()),
        ("fleet", None, schedule[0].id_hex().as_str())
    );
    let shared = one.encrypt(TLS13).unwrap();
    assert_eq!(two.decrypt(&shared).as_deref(), Some(TLS13));

    // The keys become unreadable (a seal this replica cannot open): its own again, and every
    // handshake still gets a ticket.
    keys.withdraw();
    assert_eq!(two.status().source, "local");
    assert!(two.encrypt(TLS13).is_some());
}

#[test]
fn keys_work_from_1950_to_the_end_of_9999_and_the_schedule_settles_there() {
    let period = Duration::from_secs(HOUR);
    let end = tls_source::clock::latest();
    let before_the_epoch = SystemTime::UNIX_EPOCH - Duration::from_secs(20 * 365 * 86_400);
    for now in [
        before_the_epoch,
        end,
        end + Duration::from_secs(10 * 365 * 86_400),
    ] {
        // A schedule made then is kept as it is at the next look: no key added per poll.
        let keys = next_schedule(&[], now, period, random()).unwrap().unwrap();
        assert_eq!(
            next_schedule(&keys, now, period, random()).unwrap(),
            None,
            "{now:?}"
        );
        assert!(keys.iter().all(|k| k.from() <= end), "{keys:?}");
        assert_eq!(next_due(&keys, period).map(|due| due <= end), Some(true));
        // A ticket sealed then opens then, on derived keys and on the schedule's.
        let clock = Arc::new(At(Mutex::new(now)));
        let shared = SharedTicketKeys::new();
        shared.publish(keys);
        for tickets in [
            SessionTickets::from_secret(&[1; 32]).unwrap(),
            SessionTickets::shared(shared.clone()).unwrap(),
        ] {
            let ticketer = ticketer(tickets, &clock);
            let ticket = ticketer.encrypt(TLS13).expect("sealed");
            assert_eq!(ticketer.decrypt(&ticket).as_deref(), Some(TLS13), "{now:?}");
            assert!(ticketer.status().since <= end);
        }
    }
}
