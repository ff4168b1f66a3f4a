//! Calendar timestamps as written in the Azure traces (`2023-11-16 18:17:03.9799600`), parsed by
//! hand: only differences between rows matter, so there is no time zone, and a full date-time
//! library would be a dependency for one format.

const NS_PER_S: i128 = 1_000_000_000;
const S_PER_DAY: i128 = 86_400;
const MAX_FRACTION_DIGITS: usize = 9;

/// Parses `YYYY-MM-DD HH:MM:SS[.f]` (a `T` separator is accepted too; the fraction has 1 to 9
/// digits) into nanoseconds since 1970-01-01 00:00:00 in the trace's own (unstated) zone.
/// On failure returns why, for the caller to put in an error naming the line.
pub(crate) fn parse_ns(text: &str) -> Result<i128, &'static str> {
    const SHAPE: &str = "expected `YYYY-MM-DD HH:MM:SS` with an optional fraction of a second";
    let b = text.as_bytes();
    if b.len() < 19
        || b[4] != b'-'
        || b[7] != b'-'
        || !(b[10] == b' ' || b[10] == b'T')
        || b[13] != b':'
        || b[16] != b':'
    {
        return Err(SHAPE);
    }
    let year = digits(&b[0..4]).ok_or(SHAPE)?;
    let month = digits(&b[5..7]).ok_or(SHAPE)?;
    let day = digits(&b[8..10]).ok_or(SHAPE)?;
    let hour = digits(&b[11..13]).ok_or(SHAPE)?;
    let minute = digits(&b[14..16]).ok_or(SHAPE)?;
    let second = digits(&b[17..19]).ok_or(SHAPE)?;
    let fraction_ns = match &b[19..] {
        [] => 0,
        [b'.', frac @ ..] if !frac.is_empty() && frac.len() <= MAX_FRACTION_DIGITS => {
            let value = digits(frac).ok_or(SHAPE)?;
            value * 10_i128.pow((MAX_FRACTION_DIGITS - frac.len()) as u32)
        }
        _ => return Err(SHAPE),
    };
    if !(1..=12).contains(&month) {
        return Err("month is not between 01 and 12");
    }
    if day < 1 || day > days_in_month(year, month) {
        return Err("day does not exist in that month");
    }
    if hour > 23 || minute > 59 || second > 59 {
        return Err("time of day is out of range");
    }
    let seconds =
        days_from_civil(year, month, day) * S_PER_DAY + hour * 3600 + minute * 60 + second;
    Ok(seconds * NS_PER_S + fraction_ns)
}

fn digits(b: &[u8]) -> Option<i128> {
    b.iter().try_fold(0_i128, |acc, &c| {
        c.is_ascii_digit().then(|| acc * 10 + i128::from(c - b'0'))
    })
}

fn is_leap(year: i128) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn days_in_month(year: i128, month: i128) -> i128 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date: count in 400-year eras whose years start
/// in March, so the leap day is the last day of its year.
fn days_from_civil(year: i128, month: i128, day: i128) -> i128 {
    const DAYS_PER_ERA: i128 = 146_097;
    const EPOCH_SHIFT: i128 = 719_468; // days from 0000-03-01 to 1970-01-01
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * DAYS_PER_ERA + day_of_era - EPOCH_SHIFT
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unix_epoch_is_zero() {
        assert_eq!(parse_ns("1970-01-01 00:00:00"), Ok(0));
    }

    #[test]
    fn azure_timestamps_keep_their_sub_microsecond_fraction() {
        let a = parse_ns("2023-11-16 18:17:03.9799600").unwrap();
        let b = parse_ns("2023-11-16 18:17:04.0319600").unwrap();
        assert_eq!(b - a, 52_000_000);
        // 2023-11-16 is day 19677 after the epoch.
        assert_eq!(
            a,
            (19_677 * 86_400 + 18 * 3600 + 17 * 60 + 3) * NS_PER_S + 979_960_000
        );
    }

    #[test]
    fn crossing_midnight_and_a_leap_day_adds_whole_days() {
        let before = parse_ns("2024-02-28 23:59:59.5").unwrap();
        let after = parse_ns("2024-03-01T00:00:00.5").unwrap();
        assert_eq!(after - before, (S_PER_DAY + 1) * NS_PER_S);
    }

    #[test]
    fn malformed_timestamps_say_why() {
        assert!(parse_ns("2023-11-16").is_err());
        assert!(parse_ns("2023-11-16 18:17:03.").is_err());
        assert!(parse_ns("2023-11-16 18:17:03.1234567890").is_err());
        assert_eq!(
            parse_ns("2023-02-29 00:00:00"),
            Err("day does not exist in that month")
        );
        assert_eq!(
            parse_ns("2023-13-01 00:00:00"),
            Err("month is not between 01 and 12")
        );
        assert_eq!(
            parse_ns("2023-01-01 24:00:00"),
            Err("time of day is out of range")
        );
        assert!(parse_ns("2023-01-01 1x:00:00").is_err());
    }
}
