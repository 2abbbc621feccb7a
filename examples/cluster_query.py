"""The query of the README's cluster walkthrough: bytes and clicks per IP over 1 s windows.

``sparkcep deploy --zk HOST:PORT/PATH --token-file F examples/cluster_query.py``
deploys it: a file given to ``sparkcep deploy`` defines ``query``.
"""

import sparkcep as cep

query = cep.Query("clicks")
clicks = query.stream("clicks", "ip string, ts timestamp, bytes int64")
query.output("clicks_per_ip", clicks.aggregate(cep.TimeWindow("1s"), by="ip", name="per_ip",
                                                clicks=cep.count(), bytes=cep.sum("bytes")))
