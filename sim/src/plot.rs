//! Scatter plots with a Pareto front and its knee, as SVG text and as PNG bytes. IO-free; text
//! in PNGs uses an 8x8 bitmap font, so rendering needs no system fonts.

use font8x8::UnicodeFonts;

/// What to draw.
#[derive(Clone, Debug, Default)]
pub struct Plot {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    /// Every point (grey).
    pub points: Vec<(f64, f64)>,
    /// The front, drawn as a line through its points (blue).
    pub front: Vec<(f64, f64)>,
    /// The knee (red, labelled).
    pub knee: Option<((f64, f64), String)>,
}

const W: f64 = 720.0;
const H: f64 = 460.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 24.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 56.0;

/// Round tick positions covering [lo, hi].
fn ticks(lo: f64, hi: f64) -> Vec<f64> {
    let span = (hi - lo).max(f64::MIN_POSITIVE);
    let raw = span / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let first = (lo / step).ceil() * step;
    (0..)
        .map(|i| first + i as f64 * step)
        .take_while(|v| *v <= hi + step * 1e-9)
        .collect()
}

fn fmt_tick(v: f64) -> String {
    if v.abs() >= 1000.0 || v == v.trunc() {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Data bounds padded by 5%, and the maps from data to pixels.
struct Frame {
    x: (f64, f64),
    y: (f64, f64),
}

impl Frame {
    fn new(p: &Plot) -> Frame {
        let all = p.points.iter().chain(&p.front);
        let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
        for &(x, y) in all {
            x0 = x0.min(x);
            x1 = x1.max(x);
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
        if x0 > x1 {
            (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
        }
        let pad = |a: f64, b: f64| {
            let d = if b > a {
                (b - a) * 0.05
            } else {
                a.abs().max(1.0) * 0.1
            };
            (a - d, b + d)
        };
        Frame {
            x: pad(x0, x1),
            y: pad(y0.min(0.0).max(y0 - (y1 - y0)), y1),
        }
    }

    fn px(&self, x: f64) -> f64 {
        LEFT + (x - self.x.0) / (self.x.1 - self.x.0) * (W - LEFT - RIGHT)
    }

    fn py(&self, y: f64) -> f64 {
        H - BOTTOM - (y - self.y.0) / (self.y.1 - self.y.0) * (H - TOP - BOTTOM)
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The plot as an SVG document.
pub fn svg(p: &Plot) -> String {
    let f = Frame::new(p);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    s += &format!(
        "<text x=\"{}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n",
        W / 2.0,
        esc(&p.title)
    );
    for t in ticks(f.x.0, f.x.1) {
        let x = f.px(t);
        s += &format!(
            "<line x1=\"{x:.1}\" y1=\"{TOP}\" x2=\"{x:.1}\" y2=\"{}\" stroke=\"#eee\"/>\n",
            H - BOTTOM
        );
        s += &format!(
            "<text x=\"{x:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
            H - BOTTOM + 16.0,
            fmt_tick(t)
        );
    }
    for t in ticks(f.y.0, f.y.1) {
        let y = f.py(t);
        s += &format!(
            "<line x1=\"{LEFT}\" y1=\"{y:.1}\" x2=\"{}\" y2=\"{y:.1}\" stroke=\"#eee\"/>\n",
            W - RIGHT
        );
        s += &format!(
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n",
            LEFT - 6.0,
            y + 4.0,
            fmt_tick(t)
        );
    }
    s += &format!(
        "<rect x=\"{LEFT}\" y=\"{TOP}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#444\"/>\n",
        W - LEFT - RIGHT,
        H - TOP - BOTTOM
    );
    s += &format!(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
        (LEFT + W - RIGHT) / 2.0,
        H - 14.0,
        esc(&p.x_label)
    );
    s += &format!(
        "<text x=\"18\" y=\"{:.1}\" text-anchor=\"middle\" transform=\"rotate(-90 18 {:.1})\">{}</text>\n",
        (TOP + H - BOTTOM) / 2.0,
        (TOP + H - BOTTOM) / 2.0,
        esc(&p.y_label)
    );
    for &(x, y) in &p.points {
        s += &format!(
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"#999\"/>\n",
            f.px(x),
            f.py(y)
        );
    }
    if !p.front.is_empty() {
        let pts: Vec<String> = p
            .front
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", f.px(x), f.py(y)))
            .collect();
        s += &format!(
            "<polyline points=\"{}\" fill=\"none\" stroke=\"#1f5fbf\" stroke-width=\"2\"/>\n",
            pts.join(" ")
        );
        for &(x, y) in &p.front {
            s += &format!(
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"4\" fill=\"#1f5fbf\"/>\n",
                f.px(x),
                f.py(y)
            );
        }
    }
    if let Some(((x, y), label)) = &p.knee {
        let (cx, cy) = (f.px(*x), f.py(*y));
        s += &format!("<circle cx=\"{cx:.1}\" cy=\"{cy:.1}\" r=\"8\" fill=\"none\" stroke=\"#d62728\" stroke-width=\"2.5\"/>\n");
        // About 7 px per character at 12 px: right of the knee if it fits, else left of it.
        let width = label.chars().count() as f64 * 7.0;
        let (lx, anchor) = if cx + 10.0 + width <= W {
            (cx + 10.0, "start")
        } else if cx - 10.0 - width >= 0.0 {
            (cx - 10.0, "end")
        } else {
            (4.0, "start")
        };
        s += &format!(
            "<text x=\"{lx:.1}\" y=\"{:.1}\" text-anchor=\"{anchor}\" fill=\"#d62728\">{}</text>\n",
            cy - 10.0,
            esc(label)
        );
    }
    s += "</svg>\n";
    s
}

/// An RGB raster.
struct Canvas {
    w: usize,
    h: usize,
    px: Vec<u8>,
}

impl Canvas {
    fn new(w: usize, h: usize) -> Canvas {
        Canvas {
            w,
            h,
            px: vec![255; w * h * 3],
        }
    }

    fn set(&mut self, x: i64, y: i64, c: [u8; 3]) {
        if x >= 0 && y >= 0 && (x as usize) < self.w && (y as usize) < self.h {
            let i = (y as usize * self.w + x as usize) * 3;
            self.px[i..i + 3].copy_from_slice(&c);
        }
    }

    fn line(&mut self, x0: f64, y0: f64, x1: f64, y1: f64, c: [u8; 3], width: i64) {
        let n = ((x1 - x0).abs().max((y1 - y0).abs()).ceil() as i64).max(1);
        for i in 0..=n {
            let t = i as f64 / n as f64;
            let (x, y) = (x0 + (x1 - x0) * t, y0 + (y1 - y0) * t);
            for d in 0..width {
                let o = d - width / 2;
                self.set(x.round() as i64 + o, y.round() as i64, c);
                self.set(x.round() as i64, y.round() as i64 + o, c);
            }
        }
    }

    fn disc(&mut self, cx: f64, cy: f64, r: f64, c: [u8; 3], ring: bool) {
        let ri = r.ceil() as i64 + 1;
        for dy in -ri..=ri {
            for dx in -ri..=ri {
                let d = ((dx * dx + dy * dy) as f64).sqrt();
                if (!ring && d <= r) || (ring && (d - r).abs() <= 1.2) {
                    self.set(cx.round() as i64 + dx, cy.round() as i64 + dy, c);
                }
            }
        }
    }

    /// Text in the 8x8 font, left edge at x, vertical centre at y; `anchor` 0 left, 1 centre,
    /// 2 right.
    fn text(&mut self, x: f64, y: f64, s: &str, c: [u8; 3], anchor: u8) {
        let width = s.chars().count() as f64 * 8.0;
        let x0 = match anchor {
            1 => x - width / 2.0,
            2 => x - width,
            _ => x,
        }
        .round() as i64;
        let y0 = (y - 4.0).round() as i64;
        for (k, ch) in s.chars().enumerate() {
            let glyph = font8x8::BASIC_FONTS
                .get(ch)
                .unwrap_or_else(|| font8x8::BASIC_FONTS.get('?').expect("'?' exists"));
            for (row, bits) in glyph.iter().enumerate() {
                for col in 0..8 {
                    if bits & (1 << col) != 0 {
                        self.set(x0 + k as i64 * 8 + col, y0 + row as i64, c);
                    }
                }
            }
        }
    }

    /// Text read bottom to top (for the y axis label).
    fn text_up(&mut self, x: f64, y: f64, s: &str, c: [u8; 3]) {
        let len = s.chars().count() as i64 * 8;
        let y0 = (y + len as f64 / 2.0).round() as i64;
        let x0 = (x - 4.0).round() as i64;
        for (k, ch) in s.chars().enumerate() {
            let glyph = font8x8::BASIC_FONTS.get(ch).unwrap_or([0; 8]);
            for (row, bits) in glyph.iter().enumerate() {
                for col in 0..8 {
                    if bits & (1 << col) != 0 {
                        self.set(x0 + row as i64, y0 - (k as i64 * 8 + col), c);
                    }
                }
            }
        }
    }
}

/// The plot as PNG bytes.
pub fn png(p: &Plot) -> Vec<u8> {
    let f = Frame::new(p);
    let mut c = Canvas::new(W as usize, H as usize);
    let (grid, axis, ink, blue, red, grey) = (
        [235, 235, 235],
        [68, 68, 68],
        [20, 20, 20],
        [31, 95, 191],
        [214, 39, 40],
        [150, 150, 150],
    );
    c.text(W / 2.0, 22.0, &p.title, ink, 1);
    for t in ticks(f.x.0, f.x.1) {
        let x = f.px(t);
        c.line(x, TOP, x, H - BOTTOM, grid, 1);
        c.text(x, H - BOTTOM + 14.0, &fmt_tick(t), ink, 1);
    }
    for t in ticks(f.y.0, f.y.1) {
        let y = f.py(t);
        c.line(LEFT, y, W - RIGHT, y, grid, 1);
        c.text(LEFT - 6.0, y, &fmt_tick(t), ink, 2);
    }
    for (x0, y0, x1, y1) in [
        (LEFT, TOP, W - RIGHT, TOP),
        (LEFT, H - BOTTOM, W - RIGHT, H - BOTTOM),
        (LEFT, TOP, LEFT, H - BOTTOM),
        (W - RIGHT, TOP, W - RIGHT, H - BOTTOM),
    ] {
        c.line(x0, y0, x1, y1, axis, 1);
    }
    c.text((LEFT + W - RIGHT) / 2.0, H - 16.0, &p.x_label, ink, 1);
    c.text_up(16.0, (TOP + H - BOTTOM) / 2.0, &p.y_label, ink);
    for &(x, y) in &p.points {
        c.disc(f.px(x), f.py(y), 3.0, grey, false);
    }
    for w in p.front.windows(2) {
        c.line(
            f.px(w[0].0),
            f.py(w[0].1),
            f.px(w[1].0),
            f.py(w[1].1),
            blue,
            2,
        );
    }
    for &(x, y) in &p.front {
        c.disc(f.px(x), f.py(y), 4.0, blue, false);
    }
    if let Some(((x, y), label)) = &p.knee {
        let (cx, cy) = (f.px(*x), f.py(*y));
        c.disc(cx, cy, 8.0, red, true);
        // Right of the knee if it fits, else left of it, else from the left edge.
        let width = label.chars().count() as f64 * 8.0;
        if cx + 12.0 + width <= W - 4.0 {
            c.text(cx + 12.0, cy - 12.0, label, red, 0);
        } else if cx - 12.0 - width >= 4.0 {
            c.text(cx - 12.0, cy - 12.0, label, red, 2);
        } else {
            c.text(4.0, cy - 14.0, label, red, 0);
        }
    }
    let mut out = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut out, c.w as u32, c.h as u32);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut wr = enc.write_header().expect("writing to a Vec cannot fail");
        wr.write_image_data(&c.px)
            .expect("writing to a Vec cannot fail");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Plot {
        Plot {
            title: "Throughput per card vs TPOT".into(),
            x_label: "TPOT p50 (ms)".into(),
            y_label: "output tok/s per card".into(),
            points: vec![(10.0, 100.0), (20.0, 300.0), (30.0, 200.0), (40.0, 320.0)],
            front: vec![(10.0, 100.0), (20.0, 300.0), (40.0, 320.0)],
            knee: Some(((20.0, 300.0), "knee: seqs=32".into())),
        }
    }

    #[test]
    fn svg_has_every_point_the_front_and_the_knee() {
        let s = svg(&sample());
        assert!(s.starts_with("<svg"));
        assert_eq!(s.matches("fill=\"#999\"").count(), 4);
        assert!(s.contains("<polyline"));
        assert!(s.contains("knee: seqs=32"));
        assert!(s.contains("TPOT p50 (ms)"));
    }

    #[test]
    fn png_decodes_and_has_the_knee_in_red() {
        let bytes = png(&sample());
        let dec = png::Decoder::new(bytes.as_slice());
        let mut r = dec.read_info().unwrap();
        let mut buf = vec![0; r.output_buffer_size()];
        let info = r.next_frame(&mut buf).unwrap();
        assert_eq!((info.width, info.height), (W as u32, H as u32));
        let red = buf.chunks(3).filter(|p| p == &[214, 39, 40]).count();
        let blue = buf.chunks(3).filter(|p| p == &[31, 95, 191]).count();
        assert!(red > 50 && blue > 100, "red {red} blue {blue}");
    }

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        assert_eq!(ticks(0.0, 100.0), vec![0.0, 20.0, 40.0, 60.0, 80.0, 100.0]);
        let t = ticks(3.2, 4.9);
        assert!(t.len() >= 3 && t[0] >= 3.2 && *t.last().unwrap() <= 4.9 + 1e-9);
    }
}
