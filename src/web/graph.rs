//! The resource group as a graph, laid out on the server as SVG: parents left of their
//! children in layers (the longest chain of edges above a resource decides its layer), each
//! layer ordered by the mean position of its parents so that edges cross little, and a layer
//! taller than the rest wrapped into several columns, so that a thousand Pods stay a screen
//! or two to scroll rather than thirty.

use maud::{html, Markup};

use super::order::health_class;

pub const NODE_WIDTH: u32 = 210;
const NODE_HEIGHT: u32 = 22;
const ROW: u32 = 30;
const COLUMN_GAP: u32 = 70;
const WRAP_GAP: u32 = 16;
const MARGIN: u32 = 12;

pub struct Node<'a> {
    /// For the page script's in-place updates (`data-uid`, `data-ev`: see `pages::environment`).
    pub uid: &'a str,
    pub events: String,
    pub kind: &'a str,
    pub name: &'a str,
    pub health: Option<&'a str>,
    pub message: Option<&'a str>,
    pub href: String,
    /// On a path from an unhealthy root to its cause (SPEC 17).
    pub cause: bool,
}

pub struct Edge {
    pub from: usize,
    pub to: usize,
    pub owner: bool,
    /// Between two resources of a cause path.
    pub cause: bool,
}

/// Where each node goes: (x, y) of its top-left corner, and the drawing's size.
pub struct Layout {
    pub positions: Vec<(u32, u32)>,
    pub width: u32,
    pub height: u32,
}

/// Lays out `n` nodes joined by `edges` (parent to child).
pub fn layout(n: usize, edges: &[Edge], order_key: impl Fn(usize) -> String) -> Layout {
    let mut children = vec![Vec::new(); n];
    let mut parents = vec![Vec::new(); n];
    let mut indegree = vec![0usize; n];
    for e in edges {
        if e.from < n && e.to < n && e.from != e.to {
            children[e.from].push(e.to);
            parents[e.to].push(e.from);
            indegree[e.to] += 1;
        }
    }
    // Longest path from a root (Kahn's order); members of a cycle stay where they were put.
    let mut layer = vec![0usize; n];
    let mut queue: std::collections::VecDeque<usize> =
        (0..n).filter(|&i| indegree[i] == 0).collect();
    while let Some(i) = queue.pop_front() {
        for &c in &children[i] {
            layer[c] = layer[c].max(layer[i] + 1);
            indegree[c] -= 1;
            if indegree[c] == 0 {
                queue.push_back(c);
            }
        }
    }
    let layers = layer.iter().max().map_or(0, |m| m + 1);
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); layers];
    for i in 0..n {
        members[layer[i]].push(i);
    }
    // Rows per column: the tallest layer is wrapped once it is much taller than the graph is wide.
    let rows_per_column = ((n as f64 * 1.5).sqrt().ceil() as usize).max(24);
    let mut rank = vec![0f64; n];
    let mut positions = vec![(0, 0); n];
    let mut x = MARGIN;
    let mut height = 0;
    for (l, nodes) in members.iter_mut().enumerate() {
        let keys: Vec<(f64, String)> = nodes
            .iter()
            .map(|&i| {
                let mean = if l == 0 || parents[i].is_empty() {
                    f64::MAX
                } else {
                    parents[i].iter().map(|&p| rank[p]).sum::<f64>() / parents[i].len() as f64
                };
                (mean, order_key(i))
            })
            .collect();
        let mut order: Vec<usize> = (0..nodes.len()).collect();
        order.sort_by(|&a, &b| {
            keys[a]
                .0
                .total_cmp(&keys[b].0)
                .then_with(|| keys[a].1.cmp(&keys[b].1))
        });
        let sorted: Vec<usize> = order.iter().map(|&k| nodes[k]).collect();
        let columns = sorted.len().div_ceil(rows_per_column).max(1);
        for (row, &i) in sorted.iter().enumerate() {
            rank[i] = row as f64;
            let (column, within) = (row / rows_per_column, row % rows_per_column);
            let px = x + column as u32 * (NODE_WIDTH + WRAP_GAP);
            let py = MARGIN + within as u32 * ROW;
            positions[i] = (px, py);
            height = height.max(py + NODE_HEIGHT + MARGIN);
        }
        x += columns as u32 * (NODE_WIDTH + WRAP_GAP) - WRAP_GAP + COLUMN_GAP;
    }
    let width = if n == 0 { 0 } else { x - COLUMN_GAP + MARGIN };
    Layout {
        positions,
        width,
        height,
    }
}

/// At most `max` characters, with an ellipsis when cut.
fn clip(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        s.chars().take(max - 1).collect::<String>() + "…"
    }
}

/// The SVG of the graph.
pub fn svg(nodes: &[Node], edges: &[Edge]) -> Markup {
    let layout = layout(nodes.len(), edges, |i| {
        format!("{}/{}", nodes[i].kind, nodes[i].name)
    });
    let half = NODE_HEIGHT / 2;
    html! {
        svg xmlns="http://www.w3.org/2000/svg" width=(layout.width) height=(layout.height)
            viewBox={"0 0 " (layout.width) " " (layout.height)} role="group" aria-label="Resource graph" {
            @for e in edges {
                @if e.from < nodes.len() && e.to < nodes.len() && e.from != e.to {
                    @let (x1, y1) = layout.positions[e.from];
                    @let (x2, y2) = layout.positions[e.to];
                    @let (sx, sy, tx, ty) = (x1 + NODE_WIDTH, y1 + half, x2, y2 + half);
                    @let bend = (tx as i64 - sx as i64).abs() / 2 + 10;
                    path class={ (if e.owner { "e" } else { "e other" }) (if e.cause { " cause" } else { "" }) }
                        d={"M" (sx) " " (sy) "C" (sx as i64 + bend) " " (sy) " " (tx as i64 - bend) " " (ty) " " (tx) " " (ty)} {}
                }
            }
            @for (i, node) in nodes.iter().enumerate() {
                @let (x, y) = layout.positions[i];
                @let status = node.health.map(super::order::title);
                a href=(node.href) data-uid=(node.uid) data-ev=(node.events) {
                    title {
                        (node.kind) " " (node.name)
                        @if let Some(s) = &status { ": " (s) }
                        @if let Some(m) = node.message { " (" (m) ")" }
                        @if node.cause { ", on the cause path" }
                    }
                    rect class=(if node.cause { "n cause" } else { "n" }) x=(x) y=(y) width=(NODE_WIDTH) height=(NODE_HEIGHT) rx="4" {}
                    rect class={"hs-" (health_class(node.health).trim_start_matches("h-"))} x=(x) y=(y) width="6" height=(NODE_HEIGHT) rx="2" {}
                    text x=(x + 11) y=(y + 15) {
                        tspan class="k" { (clip(node.kind, 12)) " " }
                        (clip(node.name, 24 - clip(node.kind, 12).chars().count().min(12) + 4))
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_sit_right_of_their_parents() {
        // deployment -> replicaset -> 2 pods; service -> deployment (selector)
        let edges = [
            Edge {
                from: 0,
                to: 1,
                owner: true,
                cause: false,
            },
            Edge {
                from: 1,
                to: 2,
                owner: true,
                cause: false,
            },
            Edge {
                from: 1,
                to: 3,
                owner: true,
                cause: false,
            },
            Edge {
                from: 4,
                to: 0,
                owner: false,
                cause: false,
            },
        ];
        let l = layout(5, &edges, |i| i.to_string());
        assert!(l.positions[4].0 < l.positions[0].0);
        assert!(l.positions[0].0 < l.positions[1].0);
        assert!(l.positions[1].0 < l.positions[2].0);
        assert_eq!(l.positions[2].0, l.positions[3].0);
        assert_ne!(l.positions[2].1, l.positions[3].1);
        for &(x, y) in &l.positions {
            assert!(x + NODE_WIDTH <= l.width && y + NODE_HEIGHT <= l.height);
        }
    }

    #[test]
    fn a_thousand_pods_wrap_into_columns_and_cycles_do_not_hang() {
        let mut edges: Vec<Edge> = (1..1000)
            .map(|to| Edge {
                from: 0,
                to,
                owner: true,
                cause: false,
            })
            .collect();
        edges.push(Edge {
            from: 5,
            to: 0,
            owner: false,
            cause: false,
        });
        let l = layout(1000, &edges, |i| i.to_string());
        assert!(l.height < 2000, "{}", l.height);
        let mut seen = std::collections::HashSet::new();
        assert!(
            l.positions.iter().all(|p| seen.insert(*p)),
            "two nodes in one place"
        );
    }
}
