//! Charts a planner reads, drawn with `plotters` as SVG text and PNG bytes (IO-free). Text is
//! DejaVu Sans, embedded (the `dejavu` crate), so a PNG renders the same on any machine.
//!
//! Three kinds: [`Plot`] (a Pareto scatter: every point, the front numbered, its knee, the
//! chosen point and an SLO line), [`Lines`] (curves such as CDFs or latency against load) and
//! [`Bars`] (stacked shares, such as where a step's time goes). Each chart has its plotting
//! area above and a key below it: the legend, then (for a scatter) each numbered front point's
//! label, so that no label is drawn over the data. The only text on the data are the front's
//! numbers, placed where they overlap nothing ([`place`]).

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;
use std::sync::Once;

/// A Pareto scatter.
#[derive(Clone, Debug, Default)]
pub struct Plot {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    /// Every point (grey).
    pub points: Vec<(f64, f64)>,
    /// The front, left to right, each point with its label (numbered on the chart, the label
    /// in the key).
    pub front: Vec<(f64, f64, String)>,
    /// The knee: an index into `front`.
    pub knee: Option<usize>,
    /// The point a search chose, and what it is.
    pub chosen: Option<(f64, f64, String)>,
    /// A bound on x (an SLO), drawn as a dashed vertical line, and its name.
    pub x_limit: Option<(f64, String)>,
}

/// Curves, one colour each.
#[derive(Clone, Debug, Default)]
pub struct Lines {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    /// (name, points left to right).
    pub series: Vec<(String, Vec<(f64, f64)>)>,
    pub x_limit: Option<(f64, String)>,
}

/// Stacked horizontal bars: one per row, each split into named parts (shares, in %).
#[derive(Clone, Debug, Default)]
pub struct Bars {
    pub title: String,
    pub x_label: String,
    /// (row name, parts).
    pub rows: Vec<(String, Vec<(String, f64)>)>,
}

/// A pixel rectangle: x0, y0, x1, y1 (exclusive).
pub type Rect = (i32, i32, i32, i32);

const W: u32 = 760;
/// Height of the plotting part of a chart.
const CHART_H: u32 = 440;
/// Height of one line of the key.
const KEY_LINE: u32 = 18;
/// Front points listed in a scatter's key; more are counted.
const KEY_MAX: usize = 20;
const FONT: &str = "sans-serif";

const GREY: RGBColor = RGBColor(160, 160, 160);
const BLUE_: RGBColor = RGBColor(31, 95, 191);
const RED_: RGBColor = RGBColor(214, 39, 40);
const INK: RGBColor = RGBColor(20, 20, 20);
/// Distinct colours for curves and bar parts (Tableau 10).
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

fn fonts() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The embedded font is a valid TrueType file: registering it cannot fail.
        let _ = plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular());
    });
}

/// Something drawable: its size and how to draw it, returning the boxes of the labels it put
/// on the data (for the overlap test).
pub trait Figure {
    fn size(&self) -> (u32, u32);
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<Vec<Rect>, String>;
}

/// The chart as an SVG document.
pub fn svg<F: Figure>(f: &F) -> String {
    fonts();
    let mut s = String::new();
    {
        let root = SVGBackend::with_string(&mut s, f.size()).into_drawing_area();
        // Drawing into a String cannot fail but for a font error, which the embedded font rules out.
        let _ = f.draw(&root);
        let _ = root.present();
    }
    s
}

/// The chart as PNG bytes (8-bit RGB).
pub fn png<F: Figure>(f: &F) -> Vec<u8> {
    let (buf, (w, h), _) = rgb_with_labels(f);
    let mut out = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut out, w, h);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut wr = enc.write_header().expect("writing to a Vec cannot fail");
        wr.write_image_data(&buf)
            .expect("writing to a Vec cannot fail");
    }
    out
}

/// The chart rasterized (RGB rows) and the boxes of its data labels.
fn rgb_with_labels<F: Figure>(f: &F) -> (Vec<u8>, (u32, u32), Vec<Rect>) {
    fonts();
    let (w, h) = f.size();
    let mut buf = vec![255u8; (w * h * 3) as usize];
    let mut labels = Vec::new();
    {
        let root = BitMapBackend::with_buffer(&mut buf, (w, h)).into_drawing_area();
        if let Ok(l) = f.draw(&root) {
            labels = l;
        }
        let _ = root.present();
    }
    (buf, (w, h), labels)
}

/// Data bounds padded by 5% (a degenerate range widened).
fn bounds(values: impl Iterator<Item = f64>, from_zero: bool) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::MAX, f64::MIN);
    for v in values.filter(|v| v.is_finite()) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if lo > hi {
        return (0.0, 1.0);
    }
    if from_zero && lo > 0.0 {
        lo = 0.0;
    }
    let d = if hi > lo {
        (hi - lo) * 0.05
    } else {
        lo.abs().max(1.0) * 0.1
    };
    (lo - d, hi + d)
}

fn err<E: std::fmt::Debug>(e: E) -> String {
    format!("{e:?}")
}

fn overlaps(a: Rect, b: Rect) -> bool {
    a.0 < b.2 && b.0 < a.2 && a.1 < b.3 && b.1 < a.3
}

fn inside(a: Rect, area: Rect) -> bool {
    a.0 >= area.0 && a.1 >= area.1 && a.2 <= area.2 && a.3 <= area.3
}

/// Places a label of `size` (w, h) next to each anchor: the first of eight positions around
/// it, near then farther, whose box lies inside `area` and overlaps no obstacle or label
/// placed before; `None` where none fits. Obstacles are boxes to keep clear (markers).
pub fn place(
    anchors: &[(i32, i32)],
    sizes: &[(i32, i32)],
    area: Rect,
    obstacles: &[Rect],
) -> Vec<Option<Rect>> {
    let mut taken: Vec<Rect> = obstacles.to_vec();
    anchors
        .iter()
        .zip(sizes)
        .map(|(&(x, y), &(w, h))| {
            let mut found = None;
            'search: for gap in [6, 14, 24] {
                for (dx, dy) in [
                    (gap, -h - gap / 2),
                    (gap, gap / 2),
                    (-w - gap, -h - gap / 2),
                    (-w - gap, gap / 2),
                    (-w / 2, -h - gap),
                    (-w / 2, gap),
                    (gap, -h / 2),
                    (-w - gap, -h / 2),
                ] {
                    let r = (x + dx, y + dy, x + dx + w, y + dy + h);
                    if inside(r, area) && taken.iter().all(|t| !overlaps(r, *t)) {
                        found = Some(r);
                        break 'search;
                    }
                }
            }
            if let Some(r) = found {
                taken.push(r);
            }
            found
        })
        .collect()
}

/// One legend item in the key: a marker drawn by `mark` at (x, y), then the text.
type Mark<'a, DB> = Box<dyn Fn(&DrawingArea<DB, Shift>, (i32, i32)) -> Result<(), String> + 'a>;

/// A legend mark: a short horizontal line in `style`.
fn line_mark<'a, DB: DrawingBackend + 'a>(style: ShapeStyle) -> Mark<'a, DB> {
    Box::new(move |a: &DrawingArea<DB, Shift>, c: (i32, i32)| {
        a.draw(&PathElement::new(
            vec![(c.0 - 8, c.1), (c.0 + 8, c.1)],
            style,
        ))
        .map_err(err)
    })
}

/// Draws legend items in a grid of `cols` columns from the key's top; returns the y below
/// them ([`legend_lines`] of them).
fn legend<DB: DrawingBackend>(
    key: &DrawingArea<DB, Shift>,
    items: Vec<(String, Mark<'_, DB>)>,
    y0: i32,
    cols: usize,
) -> Result<i32, String> {
    let font = (FONT, 13).into_font().color(&INK);
    let col_w = (W as i32 - 80) / cols as i32;
    let n = items.len();
    for (i, (text, mark)) in items.into_iter().enumerate() {
        let x = 70 + (i % cols) as i32 * col_w;
        let y = y0 + (i / cols) as i32 * KEY_LINE as i32;
        mark(key, (x + 8, y + 8))?;
        key.draw(&Text::new(text, (x + 22, y + 1), font.clone()))
            .map_err(err)?;
    }
    Ok(y0 + legend_lines(n, cols) as i32 * KEY_LINE as i32)
}

/// Lines a legend of `n` items in `cols` columns takes.
fn legend_lines(n: usize, cols: usize) -> u32 {
    n.div_ceil(cols).max(1) as u32
}

/// Legend columns of each chart: a scatter's items are short, a curve's name may be a whole
/// layout, a bar part is an op class.
const PLOT_COLS: usize = 3;
const LINE_COLS: usize = 1;
const BAR_COLS: usize = 4;

/// A chart's axes on `area`: title, x and y descriptions, the mesh, and a dashed vertical line
/// at `x_limit` if any.
fn axes<'a, DB: DrawingBackend>(
    area: &'a DrawingArea<DB, Shift>,
    [title, x_label, y_label]: [&str; 3],
    (x, y): (std::ops::Range<f64>, std::ops::Range<f64>),
    x_limit: Option<f64>,
) -> Result<ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>, String> {
    let (y0, y1) = (y.start, y.end);
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FONT, 17).into_font())
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(x, y)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .label_style((FONT, 12))
        .axis_desc_style((FONT, 13))
        .light_line_style(RGBColor(240, 240, 240))
        .draw()
        .map_err(err)?;
    if let Some(x) = x_limit {
        chart
            .draw_series(DashedLineSeries::new(
                vec![(x, y0), (x, y1)],
                6,
                4,
                RED_.stroke_width(1),
            ))
            .map_err(err)?;
    }
    Ok(chart)
}

impl Figure for Plot {
    fn size(&self) -> (u32, u32) {
        let listed = self.front.len().min(KEY_MAX) + usize::from(self.front.len() > KEY_MAX);
        let items = 2
            + usize::from(self.knee.is_some())
            + usize::from(self.chosen.is_some())
            + usize::from(self.x_limit.is_some());
        let lines =
            legend_lines(items, PLOT_COLS) as usize + listed + usize::from(self.chosen.is_some());
        (W, CHART_H + 14 + KEY_LINE * lines as u32)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<Vec<Rect>, String> {
        root.fill(&WHITE).map_err(err)?;
        let (top, key) = root.split_vertically(CHART_H);
        let xs = self
            .points
            .iter()
            .map(|p| p.0)
            .chain(self.front.iter().map(|p| p.0))
            .chain(self.x_limit.iter().map(|l| l.0));
        let ys = self
            .points
            .iter()
            .map(|p| p.1)
            .chain(self.front.iter().map(|p| p.1));
        let (x0, x1) = bounds(xs, false);
        let (y0, y1) = bounds(ys, true);
        let mut chart = axes(
            &top,
            [&self.title, &self.x_label, &self.y_label],
            (x0..x1, y0..y1),
            self.x_limit.as_ref().map(|l| l.0),
        )?;
        chart
            .draw_series(
                self.points
                    .iter()
                    .map(|&(x, y)| Circle::new((x, y), 3, GREY.mix(0.6).filled())),
            )
            .map_err(err)?;
        chart
            .draw_series(LineSeries::new(
                self.front.iter().map(|p| (p.0, p.1)),
                BLUE_.stroke_width(2),
            ))
            .map_err(err)?;
        chart
            .draw_series(
                self.front
                    .iter()
                    .map(|p| Circle::new((p.0, p.1), 4, BLUE_.filled())),
            )
            .map_err(err)?;
        if let Some(k) = self.knee.and_then(|k| self.front.get(k)) {
            chart
                .draw_series(std::iter::once(Circle::new(
                    (k.0, k.1),
                    9,
                    RED_.stroke_width(2),
                )))
                .map_err(err)?;
        }
        if let Some((x, y, _)) = &self.chosen {
            chart
                .draw_series(std::iter::once(TriangleMarker::new(
                    (*x, *y),
                    9,
                    INK.filled(),
                )))
                .map_err(err)?;
        }
        // The front's numbers, clear of every marker of the front and of each other.
        let (px, py) = chart.plotting_area().get_pixel_range();
        let area = (px.start, py.start, px.end, py.end);
        let anchors: Vec<(i32, i32)> = self
            .front
            .iter()
            .map(|p| chart.backend_coord(&(p.0, p.1)))
            .collect();
        let font = (FONT, 12).into_font().color(&BLUE_);
        let texts: Vec<String> = (1..=self.front.len()).map(|i| i.to_string()).collect();
        let mut sizes = Vec::new();
        for t in &texts {
            let (w, h) = top.estimate_text_size(t, &font).map_err(err)?;
            sizes.push((w as i32 + 2, h as i32 + 2));
        }
        let mut obstacles: Vec<Rect> = anchors
            .iter()
            .map(|&(x, y)| (x - 5, y - 5, x + 6, y + 6))
            .collect();
        if let Some(k) = self.knee.and_then(|k| anchors.get(k)) {
            obstacles.push((k.0 - 10, k.1 - 10, k.0 + 11, k.1 + 11));
        }
        if let Some((x, y, _)) = &self.chosen {
            let (cx, cy) = chart.backend_coord(&(*x, *y));
            obstacles.push((cx - 10, cy - 10, cx + 11, cy + 11));
        }
        let placed = place(&anchors, &sizes, area, &obstacles);
        for (t, r) in texts.iter().zip(&placed) {
            if let Some(r) = r {
                top.draw(&Text::new(t.clone(), (r.0 + 1, r.1 + 1), font.clone()))
                    .map_err(err)?;
            }
        }
        // The key: the legend, then each front point.
        let mut items: Vec<(String, Mark<'_, DB>)> = vec![
            (
                "layouts".into(),
                Box::new(|a: &DrawingArea<DB, Shift>, c| {
                    a.draw(&Circle::new(c, 3, GREY.filled())).map_err(err)
                }),
            ),
            (
                "Pareto front (numbered)".into(),
                Box::new(|a: &DrawingArea<DB, Shift>, c: (i32, i32)| {
                    a.draw(&PathElement::new(
                        vec![(c.0 - 8, c.1), (c.0 + 8, c.1)],
                        BLUE_.stroke_width(2),
                    ))
                    .map_err(err)?;
                    a.draw(&Circle::new(c, 4, BLUE_.filled())).map_err(err)
                }),
            ),
        ];
        if self.knee.is_some() {
            items.push((
                "knee".into(),
                Box::new(|a: &DrawingArea<DB, Shift>, c| {
                    a.draw(&Circle::new(c, 7, RED_.stroke_width(2)))
                        .map_err(err)
                }),
            ));
        }
        if self.chosen.is_some() {
            items.push((
                "chosen".into(),
                Box::new(|a: &DrawingArea<DB, Shift>, c| {
                    a.draw(&TriangleMarker::new(c, 7, INK.filled()))
                        .map_err(err)
                }),
            ));
        }
        if let Some((_, name)) = &self.x_limit {
            items.push((name.clone(), line_mark(RED_.stroke_width(1))));
        }
        let mut y = legend(&key, items, 4, PLOT_COLS)?;
        let font = (FONT, 12).into_font().color(&INK);
        if let Some((_, _, what)) = &self.chosen {
            key.draw(&Text::new(format!("chosen: {what}"), (70, y), font.clone()))
                .map_err(err)?;
            y += KEY_LINE as i32;
        }
        for (i, (x, v, label)) in self.front.iter().enumerate().take(KEY_MAX) {
            let knee = if self.knee == Some(i) { " (knee)" } else { "" };
            key.draw(&Text::new(
                format!("{:>2}  {label}{knee}  [{x:.1}, {v:.1}]", i + 1),
                (70, y),
                font.clone(),
            ))
            .map_err(err)?;
            y += KEY_LINE as i32;
        }
        if self.front.len() > KEY_MAX {
            key.draw(&Text::new(
                format!(
                    "... and {} more front points (see the CSV)",
                    self.front.len() - KEY_MAX
                ),
                (70, y),
                font,
            ))
            .map_err(err)?;
        }
        Ok(placed.into_iter().flatten().collect())
    }
}

impl Figure for Lines {
    fn size(&self) -> (u32, u32) {
        let items = self.series.len() + usize::from(self.x_limit.is_some());
        (W, CHART_H + 14 + KEY_LINE * legend_lines(items, LINE_COLS))
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<Vec<Rect>, String> {
        root.fill(&WHITE).map_err(err)?;
        let (top, key) = root.split_vertically(CHART_H);
        let pts = || self.series.iter().flat_map(|s| s.1.iter());
        let (x0, x1) = bounds(
            pts().map(|p| p.0).chain(self.x_limit.iter().map(|l| l.0)),
            false,
        );
        let (y0, y1) = bounds(pts().map(|p| p.1), true);
        let mut chart = axes(
            &top,
            [&self.title, &self.x_label, &self.y_label],
            (x0..x1, y0..y1),
            self.x_limit.as_ref().map(|l| l.0),
        )?;
        let mut items: Vec<(String, Mark<'_, DB>)> = Vec::new();
        for (i, (name, s)) in self.series.iter().enumerate() {
            let c = PALETTE[i % PALETTE.len()];
            chart
                .draw_series(LineSeries::new(s.iter().copied(), c.stroke_width(2)))
                .map_err(err)?;
            if s.len() <= 12 {
                chart
                    .draw_series(s.iter().map(|&p| Circle::new(p, 3, c.filled())))
                    .map_err(err)?;
            }
            items.push((name.clone(), line_mark(c.stroke_width(2))));
        }
        if let Some((_, name)) = &self.x_limit {
            items.push((name.clone(), line_mark(RED_.stroke_width(1))));
        }
        legend(&key, items, 4, LINE_COLS)?;
        Ok(Vec::new())
    }
}

impl Figure for Bars {
    fn size(&self) -> (u32, u32) {
        let mut parts: Vec<&str> = Vec::new();
        for (_, ps) in &self.rows {
            for (p, _) in ps {
                if !parts.contains(&p.as_str()) {
                    parts.push(p);
                }
            }
        }
        let h = 90 + 34 * self.rows.len().max(1) as u32;
        (W, h + 14 + KEY_LINE * legend_lines(parts.len(), BAR_COLS))
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<Vec<Rect>, String> {
        root.fill(&WHITE).map_err(err)?;
        let h = 90 + 34 * self.rows.len().max(1) as u32;
        let (top, key) = root.split_vertically(h);
        let n = self.rows.len().max(1) as f64;
        let mut chart = ChartBuilder::on(&top)
            .caption(&self.title, (FONT, 17).into_font())
            .margin(12)
            .margin_right(28)
            .x_label_area_size(40)
            .y_label_area_size(150)
            .build_cartesian_2d(0f64..100f64, 0f64..n)
            .map_err(err)?;
        let names: Vec<String> = self.rows.iter().map(|r| r.0.clone()).collect();
        chart
            .configure_mesh()
            .x_desc(&self.x_label)
            .disable_y_mesh()
            .y_labels(names.len().max(1) * 2 + 1)
            .y_label_formatter(&|y| {
                // Each row's name at its middle (rows are drawn from the top).
                let i = (n - y - 0.5).round();
                if ((n - y - 0.5) - i).abs() < 1e-6 && i >= 0.0 {
                    names.get(i as usize).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .label_style((FONT, 12))
            .axis_desc_style((FONT, 13))
            .light_line_style(RGBColor(240, 240, 240))
            .draw()
            .map_err(err)?;
        let mut parts: Vec<String> = Vec::new();
        for (i, (_, ps)) in self.rows.iter().enumerate() {
            let yb = n - i as f64 - 0.8;
            let mut x = 0.0;
            for (name, v) in ps {
                let k = match parts.iter().position(|p| p == name) {
                    Some(k) => k,
                    None => {
                        parts.push(name.clone());
                        parts.len() - 1
                    }
                };
                let c = PALETTE[k % PALETTE.len()];
                let x1 = (x + v.max(0.0)).min(100.0);
                chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [(x, yb), (x1, yb + 0.6)],
                        c.filled(),
                    )))
                    .map_err(err)?;
                x = x1;
            }
        }
        let items: Vec<(String, Mark<'_, DB>)> = parts
            .iter()
            .enumerate()
            .map(|(k, p)| {
                let c = PALETTE[k % PALETTE.len()];
                let m: Mark<'_, DB> = Box::new(move |a: &DrawingArea<DB, Shift>, q: (i32, i32)| {
                    a.draw(&Rectangle::new(
                        [(q.0 - 6, q.1 - 5), (q.0 + 6, q.1 + 5)],
                        c.filled(),
                    ))
                    .map_err(err)
                });
                (p.clone(), m)
            })
            .collect();
        legend(&key, items, 4, BAR_COLS)?;
        Ok(Vec::new())
    }
}

/// A CDF of `values` as at most 400 points (the value at each share of requests).
fn cdf(values: &mut [f64]) -> Vec<(f64, f64)> {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        return Vec::new();
    }
    let step = n.div_ceil(400).max(1);
    let mut pts: Vec<(f64, f64)> = (0..n)
        .step_by(step)
        .map(|i| (values[i], (i + 1) as f64 / n as f64))
        .collect();
    if pts.last().map(|p| p.1) != Some(1.0) {
        pts.push((values[n - 1], 1.0));
    }
    pts
}

/// The charts of one run (`simulate --plots DIR`), as (file name, bytes): the TTFT and TPOT
/// CDFs over its finished requests (with the scenario's SLOs), where each instance's step
/// time goes by op class, and each instance kind's memory map of its fullest die.
pub fn run_charts(
    scenario: &crate::scenario::Scenario,
    report: &crate::run::SimReport,
    rows: &[crate::run::RequestRow],
) -> Vec<(String, Vec<u8>)> {
    let slo = &scenario.slo;
    let ms = |d: Option<dstwin_core::time::SimDuration>| d.map(|d| d.as_secs_f64() * 1e3);
    let mut ttft: Vec<f64> = rows.iter().map(|r| r.ttft_ms).collect();
    let mut tpot: Vec<f64> = rows
        .iter()
        .filter(|r| r.output_tokens > 1)
        .map(|r| r.tpot_ms)
        .collect();
    let lines = |what: &str, values: &mut [f64], limit: Option<f64>| Lines {
        title: format!(
            "{what} over the run's {} finished requests (CDF)",
            values.len()
        ),
        x_label: format!("{what} (ms)"),
        y_label: "share of requests at or below".into(),
        series: vec![(what.to_string(), cdf(values))],
        x_limit: limit.map(|x| (x, format!("{what} SLO {x} ms"))),
    };
    let bars = Bars {
        title: "Where each instance's step time goes".into(),
        x_label: "% of step time, by op class".into(),
        rows: report
            .instances
            .iter()
            .map(|i| {
                let mut parts: Vec<(String, f64)> = i
                    .time_share
                    .iter()
                    .map(|(k, v)| (k.to_string(), v * 100.0))
                    .collect();
                parts.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
                (i.name.clone(), parts)
            })
            .collect(),
    };
    let mut out = Vec::new();
    for (name, l) in [
        ("ttft_cdf", lines("TTFT", &mut ttft, ms(slo.ttft))),
        ("tpot_cdf", lines("TPOT", &mut tpot, ms(slo.tpot))),
    ] {
        out.push((format!("{name}.svg"), svg(&l).into_bytes()));
        out.push((format!("{name}.png"), png(&l)));
    }
    out.push(("step_time.svg".into(), svg(&bars).into_bytes()));
    out.push(("step_time.png".into(), png(&bars)));
    let hbm = scenario
        .instances
        .iter()
        .map(|i| i.memory.hbm)
        .fold(0.0, f64::max)
        .max(1.0);
    let memory = Bars {
        title: "Memory map of each instance's fullest die".into(),
        x_label: format!("% of the die's HBM ({:.0} GB)", hbm / 1e9),
        rows: scenario
            .instances
            .iter()
            .map(|i| {
                let m = &i.memory;
                let parts = [
                    ("runtime reserve", m.reserved),
                    ("routed experts", m.routed_expert_weights),
                    ("shared experts", m.shared_expert_weights),
                    ("attention", m.attention_weights),
                    ("dense FFN", m.dense_ffn_weights),
                    ("embedding + LM head", m.embedding_weights),
                    ("other weights", m.other_weights),
                    ("workspace", m.workspace),
                    ("KV cache", m.kv_cache),
                ];
                let parts = parts
                    .iter()
                    .filter(|p| p.1 > 0.0)
                    .map(|(k, v)| (k.to_string(), v / m.hbm.max(1.0) * 100.0))
                    .collect();
                (i.name.clone(), parts)
            })
            .collect(),
    };
    out.push(("memory.svg".into(), svg(&memory).into_bytes()));
    out.push(("memory.png".into(), png(&memory)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Plot {
        Plot {
            title: "Throughput per card vs TPOT".into(),
            x_label: "TPOT p50 (ms)".into(),
            y_label: "output tok/s per card".into(),
            points: vec![
                (10.0, 100.0),
                (20.0, 300.0),
                (30.0, 200.0),
                (40.0, 320.0),
                (20.5, 301.0),
                (21.0, 299.0),
            ],
            front: vec![
                (10.0, 100.0, "seqs=16".into()),
                (20.0, 300.0, "seqs=32".into()),
                (20.5, 301.0, "seqs=40".into()),
                (40.0, 320.0, "seqs=48".into()),
            ],
            knee: Some(1),
            chosen: Some((20.0, 300.0, "2P2D, decode TP2 x32".into())),
            x_limit: Some((35.0, "TPOT SLO 35 ms".into())),
        }
    }

    #[test]
    fn svg_has_the_title_axes_key_and_every_point() {
        let s = svg(&sample());
        assert!(s.starts_with("<svg"));
        for text in [
            "Throughput per card vs TPOT",
            "TPOT p50 (ms)",
            "output tok/s per card",
            "Pareto front (numbered)",
            "TPOT SLO 35 ms",
            "chosen: 2P2D, decode TP2 x32",
            "seqs=32 (knee)",
        ] {
            assert!(s.contains(text), "{text}");
        }
        // Six grey points, four front points (and their legend marks).
        assert!(s.matches("<circle").count() >= 10);
        assert_eq!(svg(&sample()), s, "deterministic");
    }

    /// Rasterized, the front's numbers lie inside the plotting area, clear of each other and of
    /// the front's markers, and each box holds the ink of its digit.
    #[test]
    fn front_labels_do_not_overlap_when_rasterized() {
        let p = sample();
        let (buf, (w, _), labels) = rgb_with_labels(&p);
        assert_eq!(
            labels.len(),
            p.front.len(),
            "every number placed: {labels:?}"
        );
        for (i, a) in labels.iter().enumerate() {
            for b in &labels[i + 1..] {
                assert!(!overlaps(*a, *b), "{a:?} {b:?}");
            }
            let ink = (a.1..a.3)
                .flat_map(|y| (a.0..a.2).map(move |x| (x, y)))
                .filter(|&(x, y)| {
                    let o = ((y as u32 * w + x as u32) * 3) as usize;
                    buf[o..o + 3].iter().any(|&c| c < 200)
                })
                .count();
            assert!(ink > 3, "label {i} at {a:?} has no ink");
        }
        let bytes = png(&p);
        let mut r = png::Decoder::new(bytes.as_slice()).read_info().unwrap();
        let mut px = vec![0; r.output_buffer_size()];
        let info = r.next_frame(&mut px).unwrap();
        assert_eq!((info.width, info.height), p.size());
        assert_eq!(px, buf);
    }

    #[test]
    fn lines_and_bars_render() {
        let l = Lines {
            title: "TTFT CDF".into(),
            x_label: "ms".into(),
            y_label: "share of requests".into(),
            series: vec![
                ("TTFT".into(), vec![(1.0, 0.0), (2.0, 0.5), (3.0, 1.0)]),
                ("TPOT".into(), vec![(0.5, 0.0), (4.0, 1.0)]),
            ],
            x_limit: Some((2.5, "SLO".into())),
        };
        let s = svg(&l);
        assert!(s.contains("TTFT CDF") && s.contains("SLO") && s.contains("TPOT"));
        assert!(!png(&l).is_empty());
        let b = Bars {
            title: "Where a step's time goes".into(),
            x_label: "% of step time".into(),
            rows: vec![
                (
                    "prefill".into(),
                    vec![("gemm".into(), 60.0), ("attention".into(), 40.0)],
                ),
                (
                    "decode".into(),
                    vec![("gemm".into(), 30.0), ("combine".into(), 70.0)],
                ),
            ],
        };
        let s = svg(&b);
        for t in ["prefill", "decode", "gemm", "attention", "combine"] {
            assert!(s.contains(t), "{t}");
        }
        assert!(!png(&b).is_empty());
    }

    proptest! {
        /// Placed labels never overlap each other or an obstacle and stay inside the area.
        #[test]
        fn placement_never_overlaps(pts in proptest::collection::vec((0i32..600, 0i32..400), 1..40)) {
            let area = (0, 0, 600, 400);
            let obstacles: Vec<Rect> = pts.iter().map(|&(x, y)| (x - 4, y - 4, x + 5, y + 5)).collect();
            let sizes = vec![(14, 14); pts.len()];
            let placed = place(&pts, &sizes, area, &obstacles);
            let boxes: Vec<Rect> = placed.into_iter().flatten().collect();
            for (i, a) in boxes.iter().enumerate() {
                prop_assert!(inside(*a, area));
                for o in &obstacles {
                    prop_assert!(!overlaps(*a, *o));
                }
                for b in &boxes[i + 1..] {
                    prop_assert!(!overlaps(*a, *b));
                }
            }
        }
    }
}
