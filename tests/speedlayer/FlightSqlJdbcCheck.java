// Drives the Arrow Flight SQL JDBC driver against a gateway for tests/speedlayer/test_flight_sql_jdbc.py:
// java -cp flight-sql-jdbc-driver.jar FlightSqlJdbcCheck.java <jdbc url> <user> <password>
// Prints one tab-separated line per result row, prefixed with what it answers (TABLE, COLUMN, KEY,
// GROUP, POINT).
import java.sql.Connection;
import java.sql.DatabaseMetaData;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.Statement;
import java.util.Properties;

public class FlightSqlJdbcCheck {
    public static void main(String[] args) throws Exception {
        Properties properties = new Properties();
        properties.setProperty("user", args[1]);
        properties.setProperty("password", args[2]);
        try (Connection connection = DriverManager.getConnection(args[0], properties)) {
            DatabaseMetaData metadata = connection.getMetaData();
            try (ResultSet tables = metadata.getTables(null, null, "%", null)) {
                while (tables.next()) {
                    System.out.println("TABLE\t" + tables.getString("TABLE_CAT") + "\t" + tables.getString("TABLE_SCHEM")
                        + "\t" + tables.getString("TABLE_NAME") + "\t" + tables.getString("TABLE_TYPE"));
                }
            }
            try (ResultSet columns = metadata.getColumns(null, null, "orders", "%")) {
                while (columns.next()) {
                    System.out.println("COLUMN\t" + columns.getString("COLUMN_NAME") + "\t" + columns.getString("TYPE_NAME"));
                }
            }
            try (ResultSet keys = metadata.getPrimaryKeys(null, null, "orders")) {
                while (keys.next()) {
                    System.out.println("KEY\t" + keys.getString("COLUMN_NAME"));
                }
            }
            try (ResultSet keys = metadata.getImportedKeys(null, null, "orders")) {
                while (keys.next()) {
                    System.out.println("KEY\t" + keys.getString("FKCOLUMN_NAME"));
                }
            }
            try (Statement statement = connection.createStatement();
                 ResultSet rows = statement.executeQuery(
                     "SELECT day, count(*) AS n, sum(amount) AS total FROM orders GROUP BY day ORDER BY day")) {
                while (rows.next()) {
                    System.out.println("GROUP\t" + rows.getString(1) + "\t" + rows.getLong(2) + "\t" + rows.getDouble(3));
                }
            }
            try (PreparedStatement statement = connection.prepareStatement(
                     "SELECT id, day, amount FROM orders WHERE id = ?")) {
                for (long id : new long[] {1234L, 2999L}) {
                    statement.setLong(1, id);
                    try (ResultSet rows = statement.executeQuery()) {
                        while (rows.next()) {
                            System.out.println("POINT\t" + rows.getLong(1) + "\t" + rows.getString(2) + "\t" + rows.getDouble(3));
                        }
                    }
                }
            }
        }
    }
}
