// The Spark JDBC dialect of Arrow Flight SQL URLs (jdbc:arrow-flight-sql:, jdbc:arrow-flight:).
//
// Why: the Arrow Flight SQL JDBC driver reports a column's JDBC type from its Arrow type alone
// (a zoned timestamp as TIMESTAMP_WITH_TIMEZONE since 18.x, a list as ARRAY, a struct, map,
// interval or duration as JAVA_OBJECT), and Spark's JDBC reader (4.0-4.3) refuses those types
// with UNRECOGNIZED_SQL_TYPE before reading a row. Nothing the server sends changes the reported
// type (the driver reads no field metadata for it), so the mapping is made here, where Spark asks:
// - TIMESTAMP_WITH_TIMEZONE: Spark's TIMESTAMP (an instant), read with getTimestamp like TIMESTAMP;
// - ARRAY: array<string>, each element as the driver's value's text (the driver reports no element
//   type; `customSchema` names the exact one, e.g. "tags ARRAY<BIGINT>", and Spark then reads the
//   elements as that type);
// - JAVA_OBJECT, OTHER: string, the driver's getString (JSON text for structs and maps), as Spark
//   itself maps STRUCT.
// Every other type keeps Spark's own mapping. Spark finds this class through
// META-INF/services/org.apache.spark.sql.jdbc.JdbcDialect (JdbcDialects registers every dialect
// the ServiceLoader lists) once its jar is on spark.jars: no registration call.
package danube.speedlayer;

import java.sql.Types;
import java.util.Locale;
import org.apache.spark.sql.jdbc.JdbcDialect;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.MetadataBuilder;
import scala.Option;

public class FlightSqlDialect extends JdbcDialect {
    private static final long serialVersionUID = 1L;

    @Override
    public boolean canHandle(String url) {
        String lower = url.toLowerCase(Locale.ROOT);
        return lower.startsWith("jdbc:arrow-flight-sql:") || lower.startsWith("jdbc:arrow-flight:");
    }

    @Override
    public Option<DataType> getCatalystType(int sqlType, String typeName, int size, MetadataBuilder md) {
        switch (sqlType) {
            case Types.TIMESTAMP_WITH_TIMEZONE:
                return Option.apply(DataTypes.TimestampType);
            case Types.ARRAY:
                return Option.apply(DataTypes.createArrayType(DataTypes.StringType));
            case Types.JAVA_OBJECT:
            case Types.OTHER:
                return Option.apply(DataTypes.StringType);
            default:
                return Option.empty();
        }
    }
}
