package timeline

import "html/template"

var pageTemplate = template.Must(template.New("page").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
{{- if .Refresh}}
<meta http-equiv="refresh" content="{{.Refresh}}">
{{- end}}
<title>{{.Title}}</title>
<style>
body { font: 14px/1.4 "DejaVu Sans", "Liberation Sans", Arial, sans-serif; color: #263238; margin: 24px; background: #fff; }
h1 { font-size: 20px; margin: 0 0 4px; }
p.status { margin: 0 0 16px; color: #455a64; font-family: "DejaVu Sans Mono", "Liberation Mono", monospace; font-size: 13px; }
svg text { font: 12px "DejaVu Sans", "Liberation Sans", Arial, sans-serif; fill: #263238; }
svg text.name { font-weight: bold; }
svg text.tick { fill: #78909c; font-size: 11px; }
svg text.bartext { font-size: 12px; }
svg text.bartext.inside { fill: #fff; }
svg line.grid { stroke: #eceff1; }
svg path.edge { fill: none; stroke: #546e7a; stroke-width: 1.2; opacity: 0.7; stroke-linejoin: round; }
svg path.edge.task { stroke-dasharray: 4 3; }
svg rect.bar, svg rect.try { stroke: rgba(0,0,0,0.25); stroke-width: 1; }
svg rect.done { fill: rgba(0,0,0,0.22); }
svg rect.pending { fill: none; stroke: #b0bec5; stroke-dasharray: 3 3; }
table { border-collapse: collapse; margin-top: 18px; font-size: 13px; }
th, td { text-align: left; padding: 3px 14px 3px 0; border-bottom: 1px solid #eceff1; }
td.state span { display: inline-block; width: 10px; height: 10px; margin-right: 6px; border-radius: 2px; }
td.slow { color: #c62828; font-weight: bold; }
footer { margin-top: 14px; color: #90a4ae; font-size: 12px; }
</style>
</head>
<body>
<h1>{{.Heading}}</h1>
<p class="status">{{.Status}}</p>
<svg id="timeline" xmlns="http://www.w3.org/2000/svg" width="{{.Width}}" height="{{.Height}}" viewBox="0 0 {{.Width}} {{.Height}}" role="img" aria-label="startup timeline">
<defs>
<marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#546e7a"/></marker>
</defs>
<g class="axis">
{{- range .Ticks}}
<line class="grid" x1="{{printf "%.1f" .X}}" y1="{{$.AxisY}}" x2="{{printf "%.1f" .X}}" y2="{{$.LegendY}}"/>
<text class="tick" x="{{printf "%.1f" .X}}" y="{{$.AxisY}}" dy="-8" text-anchor="middle">{{.Label}}</text>
{{- end}}
{{- if .ShowNow}}
<line x1="{{printf "%.1f" .NowX}}" y1="{{.AxisY}}" x2="{{printf "%.1f" .NowX}}" y2="{{.LegendY}}" stroke="#1e88e5" stroke-dasharray="2 2"/>
<text class="tick" x="{{printf "%.1f" .NowX}}" y="{{.AxisY}}" dy="-20" text-anchor="end">now</text>
{{- end}}
</g>
{{- if .HasTasks}}
<text class="tick" x="8" y="{{.TaskSepY}}" dy="4">background tasks</text>
<line class="grid" x1="{{.ChartLeft}}" y1="{{.TaskSepY}}" x2="{{.ChartRight}}" y2="{{.TaskSepY}}"/>
{{- end}}
<g class="edges">
{{- range .Edges}}
<path class="edge{{if .Task}} task{{end}}" data-from="{{.From}}" data-to="{{.To}}" d="{{.Path}}" marker-end="url(#arrow)"/>
{{- end}}
</g>
{{- range .Bars}}
{{- $bar := .}}
<g class="bar {{.Kind}}" data-name="{{.Name}}" data-state="{{.State}}">
<title>{{.Title}}</title>
<text class="name" x="8" y="{{.BarY}}" dy="13">{{.Label}}</text>
{{- range .Tries}}
<rect class="try" x="{{printf "%.1f" .X}}" y="{{$bar.BarY}}" width="{{printf "%.1f" .W}}" height="18" rx="3" fill="{{$.TryColour}}"><title>{{.Title}}</title></rect>
{{- end}}
{{- if .W}}
<rect class="bar" x="{{printf "%.1f" .X}}" y="{{.BarY}}" width="{{printf "%.1f" .W}}" height="18" rx="3" fill="{{.Colour}}"/>
{{- if .Done}}
<rect class="done" x="{{printf "%.1f" .X}}" y="{{.BarY}}" width="{{printf "%.1f" .Done}}" height="18" rx="3"/>
{{- end}}
{{- else}}
<rect class="pending" x="{{$.ChartLeft}}" y="{{.BarY}}" width="60" height="18" rx="3"/>
{{- end}}
<text class="bartext{{if .Inside}} inside{{end}}" x="{{printf "%.1f" .TextX}}" y="{{.BarY}}" dy="13"{{if .TextEnd}} text-anchor="end"{{end}}>{{.Text}}</text>
</g>
{{- end}}
<g class="legend">
{{- range .Legend}}
<rect x="{{.X}}" y="{{$.LegendY}}" width="14" height="14" rx="2" fill="{{.Colour}}"/>
<text x="{{.X}}" y="{{$.LegendY}}" dx="20" dy="12">{{.State}}</text>
{{- end}}
</g>
</svg>
<table id="phases">
<thead><tr><th>phase / task</th><th>state</th><th>after</th><th>duration</th><th>progress</th><th>rate</th><th>left</th><th>usually</th><th>failed attempts</th><th>error</th></tr></thead>
<tbody>
{{- range .Bars}}
<tr class="{{.Kind}}" data-name="{{.Name}}"><td>{{.Label}}</td><td class="state"><span style="background: {{.Colour}}"></span>{{.State}}</td><td>{{if .From}}{{.From}}{{else}}{{range $i, $d := .DependsOn}}{{if $i}}, {{end}}{{$d}}{{end}}{{end}}</td><td>{{.Duration}}</td><td>{{.Progress}}</td><td>{{.Rate}}</td><td>{{.ETA}}</td><td{{if .Slow}} class="slow"{{end}}>{{.Usual}}{{if .Slow}} — slower than usual{{end}}</td><td>{{.Failed}}</td><td>{{.Error}}</td></tr>
{{- end}}
</tbody>
</table>
<footer>{{if .Refresh}}Refreshing every {{.Refresh}}s until the start is over. {{end}}Rendered {{.Generated}}.{{range $i, $l := .Links}}{{if $i}} ·{{end}} <a href="{{$l.Href}}">{{$l.Text}}</a>{{end}}</footer>
</body>
</html>
`))
