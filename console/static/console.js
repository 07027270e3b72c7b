// Lag over time on the topic page: one uPlot chart per subscription, from the samples the page
// embeds (#lag-data: {"topic|subscription": [[unix_s, messages behind], ...]}).
(function () {
  var source = document.getElementById("lag-data");
  var holder = document.getElementById("lag-charts");
  if (!source || !holder || typeof uPlot === "undefined") { return; }
  var series = JSON.parse(source.textContent);
  Object.keys(series).forEach(function (name) {
    var points = series[name];
    var box = document.createElement("div");
    box.className = "lag-chart";
    box.setAttribute("data-series", name);
    holder.appendChild(box);
    if (points.length === 0) { box.textContent = name + ": no sample yet"; return; }
    var data = [points.map(function (p) { return p[0]; }), points.map(function (p) { return p[1]; })];
    new uPlot({ title: name + " (messages behind)", width: 640, height: 200,
                series: [{}, { label: "messages", stroke: "#2c6fbb", width: 2 }] }, data, box);
  });
})();
